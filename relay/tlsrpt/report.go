package tlsrpt

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Report is the JSON report of RFC 8460 §4.4.
type Report struct {
	OrganizationName string         `json:"organization-name"`
	DateRange        DateRange      `json:"date-range"`
	ContactInfo      string         `json:"contact-info"`
	ReportID         string         `json:"report-id"`
	Policies         []PolicyReport `json:"policies"`
}

// DateRange is the period a report covers (§4.4 "date-range").
type DateRange struct {
	Start time.Time `json:"start-datetime"`
	End   time.Time `json:"end-datetime"`
}

// PolicyReport is the result of one policy (§4.4 "policies").
type PolicyReport struct {
	Policy         PolicyDesc      `json:"policy"`
	Summary        Summary         `json:"summary"`
	FailureDetails []FailureDetail `json:"failure-details,omitempty"`
}

// PolicyDesc describes the policy (§4.4 "policy").
type PolicyDesc struct {
	Type    string   `json:"policy-type"`
	String  []string `json:"policy-string,omitempty"`
	Domain  string   `json:"policy-domain"`
	MXHosts []string `json:"mx-host,omitempty"`
}

// Summary holds the session counts (§4.4 "summary").
type Summary struct {
	Successful int64 `json:"total-successful-session-count"`
	Failed     int64 `json:"total-failure-session-count"`
}

// FailureDetail is one kind of failure (§4.4 "failure-details").
type FailureDetail struct {
	ResultType        string `json:"result-type"`
	SendingIP         string `json:"sending-mta-ip,omitempty"`
	MXHost            string `json:"receiving-mx-hostname,omitempty"`
	ReceivingIP       string `json:"receiving-ip,omitempty"`
	Count             int64  `json:"failed-session-count"`
	FailureReasonCode string `json:"failure-reason-code,omitempty"`
}

// Submitter says who sends the reports.
type Submitter struct {
	Organization string // organization-name
	Contact      string // contact-info
	Host         string // the submitter's domain, in report-id and the subject (§5.3)
}

// BuildReport makes the report of day. The report-id is unique per
// domain and period (§4.4: "a unique identifier for the report").
func BuildReport(s Submitter, day Day) Report {
	r := Report{
		OrganizationName: s.Organization,
		DateRange:        DateRange{Start: day.Start.UTC(), End: day.End.UTC()},
		ContactInfo:      s.Contact,
		ReportID:         fmt.Sprintf("%s.%d.%d@%s", day.Domain, day.Start.Unix(), day.End.Unix(), s.Host),
		Policies:         []PolicyReport{},
	}
	for _, c := range day.Counts {
		pr := PolicyReport{
			Policy:  PolicyDesc{Type: c.Policy.Type, String: c.Policy.Strings, Domain: c.Policy.Domain, MXHosts: c.Policy.MXHosts},
			Summary: Summary{Successful: c.Success, Failed: c.Failed()},
		}
		for f, n := range c.Failures {
			pr.FailureDetails = append(pr.FailureDetails, FailureDetail{ResultType: f.ResultType, SendingIP: f.SendingIP,
				MXHost: f.MXHost, ReceivingIP: f.ReceivingIP, Count: n, FailureReasonCode: f.AdditionalInfo})
		}
		slices.SortFunc(pr.FailureDetails, func(a, b FailureDetail) int {
			return cmpDetail(a, b)
		})
		r.Policies = append(r.Policies, pr)
	}
	return r
}

func cmpDetail(a, b FailureDetail) int {
	for _, p := range [][2]string{{a.ResultType, b.ResultType}, {a.MXHost, b.MXHost}, {a.ReceivingIP, b.ReceivingIP}, {a.FailureReasonCode, b.FailureReasonCode}} {
		if p[0] != p[1] {
			if p[0] < p[1] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// Gzip returns the report as gzip-compressed JSON (§5.1: reports are
// gzip-compressed, media type application/tlsrpt+gzip).
func (r Report) Gzip() ([]byte, error) {
	js, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("tls report: %w", err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(js); err != nil {
		return nil, fmt.Errorf("tls report: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("tls report: %w", err)
	}
	return buf.Bytes(), nil
}
