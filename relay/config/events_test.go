package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate_Events(t *testing.T) {
	dir := t.TempDir()
	secret, empty := filepath.Join(dir, "secret"), filepath.Join(dir, "empty")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hook := func(fields string) string { return "events:\n  webhooks: [{" + fields + "}]\n" }
	cases := []struct{ name, file, want string }{
		{"good", hook("url: https://app.test/h, events: [delivered, bounced], secret_file: " + secret), ""},
		{"every kind", hook("url: http://127.0.0.1:9/h, secret_file: " + secret), ""},
		{"no secret", hook("url: https://app.test/h"), "events.webhooks[0].secret_file: empty"},
		{"missing secret", hook("url: https://app.test/h, secret_file: /nonexistent/s"), "events.webhooks[0].secret_file"},
		{"empty secret", hook("url: https://app.test/h, secret_file: " + empty), "is empty"},
		{"bad url", hook("url: ftp://app.test/h, secret_file: " + secret), "events.webhooks[0].url"},
		{"bad kind", hook("url: https://app.test/h, events: [opened], secret_file: " + secret), "events.webhooks[0].events"},
		{"twice", "events:\n  webhooks: [{url: https://a.test/, secret_file: " + secret + "}, {url: https://a.test/, secret_file: " + secret + "}]\n", "listed twice"},
		{"bad tag", "events:\n  tag: drop\n", "events.tag"},
		{"no max age", "events:\n  max_age: 0s\n", "events.max_age"},
		{"no timeout", "events:\n  timeout: 0s\n", "events.timeout"},
		{"no batch", "events:\n  batch_size: 0\n", "events.batch_size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.file, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want mention of %q", err, tc.want)
			}
		})
	}
	if b, err := ReadSecret(secret); err != nil || string(b) != "s3cret" {
		t.Errorf("ReadSecret = %q, %v", b, err)
	}
}
