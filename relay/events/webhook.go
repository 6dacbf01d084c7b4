package events

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// The headers of a webhook POST. The signature is HMAC-SHA256, keyed with
// the webhook's secret, over the timestamp, a dot and the body, in hex:
// a receiver recomputes it, compares in constant time and refuses a
// timestamp far from its clock, so a captured request cannot be replayed
// later.
const (
	TimestampHeader = "X-Greyrelay-Timestamp" // Unix seconds of the POST
	SignatureHeader = "X-Greyrelay-Signature" // "sha256=" + hex HMAC
)

// Sign returns the signature header's value for body sent at ts.
func Sign(secret []byte, ts string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

func newWebhookSink(e *Events, w Webhook) *sink {
	s := &sink{name: "webhook " + w.URL, label: Label(w.URL), wake: make(chan struct{}, 1)}
	if len(w.Kinds) > 0 {
		s.kinds = map[Kind]bool{}
		for _, k := range w.Kinds {
			s.kinds[k] = true
		}
	}
	s.send = func(ctx context.Context, batch [][]byte) error { return e.post(ctx, w, batch) }
	return s
}

// Label is a webhook's metrics label: its URL without credentials, query
// or fragment, which may hold secrets.
func Label(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "invalid"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// post sends one signed batch; any answer but 2xx is a failure.
func (e *Events) post(ctx context.Context, w Webhook, batch [][]byte) error {
	body := joinBatch(batch)
	ctx, cancel := context.WithTimeout(ctx, e.opt.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	ts := strconv.FormatInt(e.opt.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "greyrelay")
	req.Header.Set(TimestampHeader, ts)
	req.Header.Set(SignatureHeader, Sign(w.Secret, ts, body))
	resp, err := e.opt.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", Label(w.URL), resp.Status)
	}
	return nil
}
