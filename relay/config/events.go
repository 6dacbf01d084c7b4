package config

import (
	"net/url"
	"os"
	"strconv"
	"strings"
)

// eventKinds are the names events.webhooks[].events accepts (relay/events).
var eventKinds = []string{"accepted", "delivered", "relayed", "deferred", "delayed", "bounced", "expired", "held", "released", "deleted", "suppressed", "refused"}

// events checks the event sinks: webhooks need an http(s) URL and a
// readable, non-empty secret, since an unsigned event could be forged.
func (v *validator) events(e Events) {
	v.positive("events.max_age", int64(e.MaxAge))
	v.positive("events.timeout", int64(e.Timeout))
	v.positive("events.batch_size", int64(e.BatchSize))
	v.oneOf("events.tag", e.Tag, "keep", "strip")
	seen := map[string]bool{}
	for i, w := range e.Webhooks {
		key := "events.webhooks[" + strconv.Itoa(i) + "]"
		u, err := url.Parse(w.URL)
		v.check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "",
			"%s.url: %q is not an http or https URL", key, w.URL)
		// A webhook's pending events are kept under its URL.
		v.check(!seen[w.URL], "%s.url: %s is listed twice", key, w.URL)
		seen[w.URL] = true
		for _, k := range w.Events {
			v.oneOf(key+".events", k, eventKinds...)
		}
		if w.SecretFile == "" {
			v.check(false, "%s.secret_file: empty (every POST is signed)", key)
			continue
		}
		b, err := os.ReadFile(w.SecretFile)
		v.check(err == nil, "%s.secret_file: %v", key, err)
		v.check(err != nil || strings.TrimSpace(string(b)) != "", "%s.secret_file: %s is empty", key, w.SecretFile)
	}
}

// ReadSecret reads a webhook's secret: the file without trailing line ends.
func ReadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return []byte(strings.TrimRight(string(b), "\r\n")), nil
}
