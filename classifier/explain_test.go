package classifier

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

func TestCatalogue_EveryReason(t *testing.T) {
	for _, r := range Reasons() {
		e, ok := catalogue(string(r))
		if !ok {
			t.Errorf("no catalogue entry for reason %q", r)
		}
		checkEntry(t, string(r), e)
	}
}

func TestCatalogue_EveryCodeInDefaultRules(t *testing.T) {
	for _, r := range DefaultRules() {
		if r.Enhanced == "" {
			continue
		}
		parts := strings.Split(r.Enhanced, ".")
		key := "X." + parts[1] + "." + parts[2] // "x" detail is the subject entry
		e, ok := catalogue(key)
		if !ok {
			t.Errorf("rule %+v: no catalogue entry %s", r, key)
		}
		checkEntry(t, key, e)
	}
}

func TestCatalogue_CommonCodes(t *testing.T) {
	codes := []string{"1.1", "1.2", "1.3", "1.6", "1.7", "1.8", "1.10", "2.0", "2.1", "2.2", "2.3",
		"3.0", "3.1", "3.2", "3.4", "3.5", "4.1", "4.2", "4.3", "4.4", "4.5", "4.6", "4.7",
		"5.1", "5.2", "5.3", "5.4", "7.0", "7.1", "7.4", "7.5", "7.8", "7.10", "7.11",
		"6.7", "6.8", "6.9", "7.25", "7.26", "7.27", "7.28", "7.500"}
	subjects := []string{"1", "2", "3", "4", "5", "6", "7"}
	for _, c := range codes {
		e, ok := catalogue("X." + c)
		if !ok {
			t.Errorf("no entry for X.%s", c)
		}
		checkEntry(t, c, e)
	}
	for _, s := range subjects {
		e, ok := catalogue("X." + s + ".x")
		if !ok {
			t.Errorf("no entry for subject X.%s.x", s)
		}
		checkEntry(t, s, e)
	}
	checkEntry(t, "generic", Explain("no-such-reason", ""))
}

func checkEntry(t *testing.T, key string, e Explanation) {
	t.Helper()
	faults := map[Fault]bool{FaultSender: true, FaultRecipientServer: true, FaultRelay: true, FaultNetwork: true, FaultUnknown: true}
	if e.Meaning == "" || e.Action == "" || !faults[e.Fault] {
		t.Errorf("%s: incomplete entry %+v", key, e)
	}
	for _, s := range []string{e.Meaning, e.Action, e.String()} {
		if strings.ContainsAny(s, "\r\n") || !strings.HasSuffix(s, ".") {
			t.Errorf("%s: not a single-line sentence: %q", key, s)
		}
	}
}

func TestExplain_Precedence(t *testing.T) {
	x35, _ := catalogue("X.3.5")
	x7x, _ := catalogue("X.7.x")
	grey, _ := catalogue(string(Greylisted))
	dns, _ := catalogue(string(DNS))
	unknown, _ := catalogue(string(Unknown))
	generic, _ := catalogue("generic")
	cases := []struct {
		reason   Reason
		enhanced string
		meaning  string
		class    string
	}{
		{ServerConfig, "4.3.5", x35.Meaning, "Class 4"},
		{Unknown, "5.3.5", x35.Meaning, "Class 5"},
		{Policy, "5.7.99", x7x.Meaning, "Class 5"},     // subject fallback
		{Greylisted, "4.2.0", grey.Meaning, "Class 4"}, // reason beats the arbitrary code
		{Greylisted, "4.7.1", grey.Meaning, "Class 4"}, // rspamd
		{DNS, "", dns.Meaning, ""},                     // reason without a code
		{Unknown, "4.0.0", unknown.Meaning, "Class 4"}, // X.0.x says nothing
		{"bogus", "", generic.Meaning, ""},             // generic
		{"bogus", "garbage", generic.Meaning, ""},      // unparseable code
	}
	for _, tc := range cases {
		e := Explain(tc.reason, tc.enhanced)
		if e.Meaning != tc.meaning {
			t.Errorf("Explain(%q, %q) = %q, want %q", tc.reason, tc.enhanced, e.Meaning, tc.meaning)
		}
		if hasClass := strings.Contains(e.Action, "Class "); hasClass != (tc.class != "") || !strings.Contains(e.Action, tc.class) {
			t.Errorf("Explain(%q, %q) action %q, want class note %q", tc.reason, tc.enhanced, e.Action, tc.class)
		}
	}
}

func TestExplain_String(t *testing.T) {
	s := Explain(ServerConfig, "4.3.5").String()
	for _, want := range []string{"misconfigured", "Usually at fault: recipient-server.", "postmaster", "keeps retrying"} {
		if !strings.Contains(s, want) {
			t.Errorf("String() = %q, missing %q", s, want)
		}
	}
}

// ExampleExplain shows the text an operator sees for a verdict.
func ExampleExplain() {
	c, _ := New(nil)
	v := c.Classify(smtpvocab.StageRCPT, &smtpvocab.Reply{Code: 451, Enhanced: "4.3.5", Text: "Server configuration error"})
	fmt.Println(v.Reason, v.Status())
	fmt.Println(Explain(v.Reason, v.Status()))
	// Output:
	// server-config 4.3.5
	// The receiving system is misconfigured; nothing is wrong with the message. Usually at fault: recipient-server. If it lasts past a day, contact the recipient's postmaster with the reply text and time. Class 4 (temporary): greyrelay keeps retrying until the message expires.
}

// TestExplainExpired: the explanation of an expired recipient's last
// deferral says greyrelay gave up, not that it keeps retrying.
func TestExplainExpired(t *testing.T) {
	for _, c := range []struct {
		reason   Reason
		enhanced string
	}{{Greylisted, "4.7.1"}, {ServerError, "4.3.0"}, {Connect, "4.4.1"}, {RateLimited, ""}} {
		live, expired := Explain(c.reason, c.enhanced), ExplainExpired(c.reason, c.enhanced)
		if c.enhanced != "" && !strings.Contains(live.Action, "keeps retrying") {
			t.Errorf("%s %s: Explain %q does not say it keeps retrying", c.reason, c.enhanced, live.Action)
		}
		if strings.Contains(expired.String(), "keeps retrying") || !strings.Contains(expired.Action, "gave up") {
			t.Errorf("%s %s: ExplainExpired %q, want it to say greyrelay gave up", c.reason, c.enhanced, expired)
		}
		if expired.Meaning != live.Meaning || expired.Fault != live.Fault {
			t.Errorf("%s %s: ExplainExpired chose another entry: %+v vs %+v", c.reason, c.enhanced, expired, live)
		}
	}
}

// The operator's actions explain themselves, whatever the last reply of
// the recipient was: a mailbox-full deferral that the operator then
// bounced must not read "greyrelay keeps retrying until the message
// expires".
// operatorReasons counts the Reason constants named Operator* in
// classifier.go: a new operator action needs a case here.
func operatorReasons(t *testing.T) int {
	f, err := parser.ParseFile(token.NewFileSet(), "classifier.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		if v, ok := node.(*ast.ValueSpec); ok {
			if id, ok := v.Type.(*ast.Ident); ok && id.Name == "Reason" && strings.HasPrefix(v.Names[0].Name, "Operator") {
				n += len(v.Names)
			}
		}
		return true
	})
	return n
}

func TestExplain_OperatorActions(t *testing.T) {
	cases := []struct {
		reason Reason
		says   string
	}{
		{OperatorBounced, "returned this message to its sender"},
		{OperatorHeld, "on hold"},
		{OperatorReleased, "released this recipient from hold"},
		{OperatorDeleted, "deleted this recipient"},
	}
	if n := operatorReasons(t); len(cases) != n {
		t.Fatalf("%d cases for %d operator reasons", len(cases), n)
	}
	for _, tc := range cases {
		for _, enhanced := range []string{"", "4.2.2", "5.1.1", "garbage"} {
			e := Explain(tc.reason, enhanced)
			if !strings.Contains(e.Meaning, tc.says) || e.Fault != FaultOperator {
				t.Errorf("Explain(%q, %q) = %+v, want the operator's action (%q)", tc.reason, enhanced, e, tc.says)
			}
			if strings.Contains(e.Action, "Class ") || strings.Contains(e.Meaning, "mailbox") {
				t.Errorf("Explain(%q, %q) speaks of the last reply: %+v", tc.reason, enhanced, e)
			}
			for _, s := range []string{e.Meaning, e.Action, e.String()} {
				if strings.ContainsAny(s, "\r\n") || !strings.HasSuffix(s, ".") {
					t.Errorf("%s: not a single-line sentence: %q", tc.reason, s)
				}
			}
		}
	}
}
