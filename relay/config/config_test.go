package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/configs"
)

func load(t *testing.T, file string, env map[string]string) (*Config, error) {
	t.Helper()
	return Load(Source{
		Default:  configs.Default,
		File:     []byte(file),
		FileName: "test.yaml",
		Getenv:   func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		ReadFile: os.ReadFile,
		Hostname: func() (string, error) { return "relay.test", nil },
		Environ: func() []string {
			var kv []string
			for k, v := range env {
				kv = append(kv, k+"="+v)
			}
			return kv
		},
	})
}

func TestDefault_IsValidAndLoopbackOnly(t *testing.T) {
	c, err := load(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("embedded default does not validate: %v", err)
	}
	if len(c.Listeners) != 1 || c.Listeners[0].Address != "127.0.0.1:2525" || c.Listeners[0].Mode != ModeSMTP {
		t.Errorf("listeners = %+v", c.Listeners)
	}
	if c.Admin.Address != "127.0.0.1:8025" || c.Queue.Path != "./greyrelay-data/queue.db" {
		t.Errorf("admin %q queue %q", c.Admin.Address, c.Queue.Path)
	}
	if c.Hostname != "relay.test" {
		t.Errorf("hostname = %q, want the system hostname", c.Hostname)
	}
	if c.History.Retention != 7*24*time.Hour || c.History.MaxMessages != 100000 {
		t.Errorf("history = %+v, want 7 days and 100000 messages", c.History)
	}
	if c.Retry.Lifetime != 120*time.Hour || c.Retry.GreylistFirstRetry != 30*time.Second {
		t.Errorf("retry = %+v", c.Retry)
	}
	// Postfix's default_destination_concurrency_limit.
	if c.Delivery.MaxPerDestination != 20 || c.Delivery.MaxConnections != 200 {
		t.Errorf("delivery.max_per_destination = %d, max_connections = %d; want 20 and 200",
			c.Delivery.MaxPerDestination, c.Delivery.MaxConnections)
	}
}

// Every key of the Config struct must appear in the embedded default, with
// its comment: that file is the documentation.
func TestDefault_DocumentsEveryKey(t *testing.T) {
	var tree map[string]any
	if err := yaml.Unmarshal(configs.Default, &tree); err != nil {
		t.Fatal(err)
	}
	for _, path := range keyPaths(reflect.TypeOf(Config{}), "") {
		if !hasPath(tree, strings.Split(path, ".")) {
			t.Errorf("key %s is missing from configs/default.yaml", path)
		}
	}
}

func keyPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		if !t.Field(i).IsExported() {
			continue
		}
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		p := prefix + tag
		out = append(out, p)
		ft := t.Field(i).Type
		if ft.Kind() == reflect.Struct && ft != durationType {
			out = append(out, keyPaths(ft, p+".")...)
		}
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct && tag == "listeners" {
			out = append(out, keyPaths(ft.Elem(), p+".0.")...)
		}
	}
	return out
}

func hasPath(node any, path []string) bool {
	if len(path) == 0 {
		return true
	}
	switch n := node.(type) {
	case map[string]any:
		v, ok := n[path[0]]
		return ok && hasPath(v, path[1:])
	case []any:
		return path[0] == "0" && len(n) > 0 && hasPath(n[0], path[1:])
	}
	return false
}

func TestLoad_UnknownKeyIsNamed(t *testing.T) {
	for _, file := range []string{"limits:\n  max_mesage_bytes: 10\n", "hostnme: x\n", "delivery:\n  smarthost:\n    adress: x\n"} {
		_, err := load(t, file, nil)
		if err == nil || !strings.Contains(err.Error(), "unknown key") {
			t.Errorf("%q: err = %v, want an unknown key error", file, err)
		}
	}
}

func TestLoad_FileOverridesDefault(t *testing.T) {
	c, err := load(t, "limits:\n  max_recipients: 7\nlisteners:\n  - address: 127.0.0.1:2600\n    mode: smtp\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.MaxRecipients != 7 || c.Limits.MaxMessageBytes != 26214400 {
		t.Errorf("limits = %+v", c.Limits)
	}
	if len(c.Listeners) != 1 || c.Listeners[0].Address != "127.0.0.1:2600" {
		t.Errorf("listeners = %+v", c.Listeners)
	}
}

func TestLoad_ListenerModeDefaultsToSMTP(t *testing.T) {
	c, err := load(t, "listeners:\n  - address: 127.0.0.1:2600\n  - address: 127.0.0.1:2601\n    mode: submission\n    tls_cert: c.pem\n    tls_key: k.pem\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := []ListenerMode{c.Listeners[0].Mode, c.Listeners[1].Mode}; got[0] != ModeSMTP || got[1] != ModeSubmission {
		t.Errorf("modes = %v, want [smtp submission]", got)
	}
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "mode") {
		t.Errorf("Validate: %v", err)
	}
}

func TestLoad_Environment(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "pw")
	os.WriteFile(secret, []byte("s3cret\n"), 0o600)
	c, err := load(t, "", map[string]string{
		"GREYRELAY_DELIVERY_SMARTHOST_ADDRESS":          "127.0.0.9:25",
		"GREYRELAY_DELIVERY_SMARTHOST_PASSWORD_FILE":    secret,
		"GREYRELAY_DELIVERY_PORT":                       "2526",
		"GREYRELAY_TRUSTED_NETWORKS":                    "",
		"GREYRELAY_LISTENERS_0_ADDRESS":                 "0.0.0.0:2525",
		"GREYRELAY_LISTENERS_1_ADDRESS":                 "0.0.0.0:2587",
		"GREYRELAY_LISTENERS_1_MODE":                    "smtp",
		"GREYRELAY_RETRY_DELAY_WARNINGS":                "1h,2h",
		"GREYRELAY_DELIVERY_ROUTES":                     "a.test=127.0.0.1:25, b.test=127.0.0.2:25",
		"GREYRELAY_DELIVERY_ALLOW_PRIVATE_DESTINATIONS": "true",
	})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Delivery
	if d.Smarthost.Address != "127.0.0.9:25" || d.Smarthost.Password != "s3cret" || d.Port != 2526 || !d.AllowPrivateDestinations {
		t.Errorf("delivery = %+v", d)
	}
	if len(c.TrustedNetworks) != 0 {
		t.Errorf("trusted = %v, want none", c.TrustedNetworks)
	}
	if len(c.Listeners) != 2 || c.Listeners[0].Address != "0.0.0.0:2525" || c.Listeners[0].Mode != "smtp" || c.Listeners[1].Address != "0.0.0.0:2587" {
		t.Errorf("listeners = %+v", c.Listeners)
	}
	if !reflect.DeepEqual(c.Retry.DelayWarnings, []time.Duration{time.Hour, 2 * time.Hour}) {
		t.Errorf("delay warnings = %v", c.Retry.DelayWarnings)
	}
	if d.Routes["b.test"] != "127.0.0.2:25" {
		t.Errorf("routes = %v", d.Routes)
	}
	if _, err := load(t, "", map[string]string{"GREYRELAY_DELIVERY_PORT": "x"}); err == nil || !strings.Contains(err.Error(), "GREYRELAY_DELIVERY_PORT") {
		t.Errorf("bad env value: err = %v", err)
	}
}

func TestValidate_Refusals(t *testing.T) {
	cases := []struct{ name, file, want string }{
		{"open v4", "trusted_networks: [0.0.0.0/0]\n", "open relay"},
		{"open v6", "trusted_networks: [\"::/0\"]\n", "open relay"},
		{"zero limit", "limits:\n  max_recipients: 0\n", "limits.max_recipients"},
		{"zero size", "limits:\n  max_message_bytes: 0\n", "limits.max_message_bytes"},
		{"submission without tls", "listeners:\n  - address: 127.0.0.1:587\n    mode: submission\n", "needs tls_cert"},
		{"unreadable users", "users_file: /nonexistent/users\n", "users_file"},
		{"bad mode", "listeners:\n  - address: 127.0.0.1:25\n    mode: lmtp\n", "mode"},
		{"public admin without token", "admin:\n  address: 0.0.0.0:8025\n", "admin.token"},
		{"allowed host with port", "admin:\n  allowed_hosts: [\"relay.example:8025\"]\n", "admin.allowed_hosts"},
		{"allowed host as URL", "admin:\n  allowed_hosts: [\"http://relay.example\"]\n", "admin.allowed_hosts"},
		{"allowed host wildcard", "admin:\n  allowed_hosts: [\"*\"]\n", "admin.allowed_hosts"},
		{"bad source", "delivery:\n  source_ipv4: \"::1\"\n", "source_ipv4"},
		{"bad tls", "delivery:\n  tls: maybe\n", "delivery.tls"},
		{"bad smarthost tls", "delivery:\n  smarthost:\n    tls: STARTTLS\n", "delivery.smarthost.tls"},
		{"bad dnssec", "delivery:\n  dnssec: on\n", "delivery.dnssec"},
		{"zero delay warning", "retry:\n  delay_warnings: [0s]\n", "delay_warnings"},
		{"bad rule", "retry:\n  rules: [{pattern: \"(\", reason: greylisted}]\n", "retry.rules"},
		{"long commit delay", "queue:\n  commit_delay: 1s\n", "queue.commit_delay"},
		{"negative commit delay", "queue:\n  commit_delay: -1ms\n", "queue.commit_delay"},
		{"negative history retention", "history:\n  retention: -1h\n", "history.retention"},
		{"unbounded history", "history:\n  max_messages: 0\n", "history.max_messages"},
		{"bad literal policy", "delivery:\n  address_literals: lookup\n", "delivery.address_literals"},
		{"tiny line limit", "delivery:\n  line_length_limit: 10\n", "delivery.line_length_limit"},
		{"zero mx addresses", "delivery:\n  mx_address_limit: 0\n", "delivery.mx_address_limit"},
		{"zero mx sessions", "delivery:\n  mx_session_limit: 0\n", "delivery.mx_session_limit"},
		{"zero ipv6 prefix", "limits:\n  ipv6_prefix_length: 0\n", "limits.ipv6_prefix_length"},
		{"long ipv6 prefix", "limits:\n  ipv6_prefix_length: 129\n", "limits.ipv6_prefix_length"},
		{"bad postmaster", "postmaster: \"root\"\n", "postmaster"},
		{"bad tls report sender", "tls_reporting:\n  from: \"tlsrpt\"\n", "tls_reporting.from"},
		{"zero tls report timeout", "tls_reporting:\n  timeout: 0s\n", "tls_reporting.timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.file, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want mention of %q", err, tc.want)
			}
		})
	}
}

func TestLoad_TypeErrorNamesKey(t *testing.T) {
	_, err := load(t, "retry:\n  factor: double\n", nil)
	if err == nil || !strings.Contains(err.Error(), "key factor") {
		t.Errorf("err = %v, want the key named", err)
	}
}

// A missing secret file is reported by Validate along with every other
// problem, not as the first and only error of Load.
func TestValidate_ReportsEverything(t *testing.T) {
	c, err := load(t, "admin:\n  token_file: /nonexistent/token\nusers_file: /nonexistent/users\nlimits:\n  max_connections: 0\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{"admin.token_file", "users_file", "limits.max_connections"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want mention of %s", err, want)
		}
	}
}

func TestValidate_AdminAllowedHosts(t *testing.T) {
	c, err := load(t, "admin:\n  allowed_hosts: [greyrelay, relay.example.com., 192.0.2.1, \"[2001:db8::1]\", \"::1\", my_host.lan]\n",
		map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("valid allowed_hosts refused: %v", err)
	}
	c, err = load(t, "", map[string]string{"GREYRELAY_ADMIN_ALLOWED_HOSTS": "greyrelay, relay.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Admin.AllowedHosts, "|") != "greyrelay|relay.example.com" {
		t.Errorf("from the environment: %q", c.Admin.AllowedHosts)
	}
}

// TestLimitsProblems: every unset limit is named, in a fixed order, with
// the same message Validate and smtpd.New give.
func TestLimitsProblems(t *testing.T) {
	ps := Limits{}.Problems()
	if len(ps) != 16 || !strings.HasPrefix(ps[0], "limits.max_message_bytes:") ||
		!strings.HasPrefix(ps[15], "limits.ipv6_prefix_length:") {
		t.Errorf("Problems() = %q", ps)
	}
	for _, tt := range []struct {
		l    Limits
		want string
	}{
		{Limits{ReservedConnectionsPercent: -1}, "reserved_connections_percent: -1, want 0 to 90"},
		{Limits{ReservedConnectionsPercent: 91}, "reserved_connections_percent: 91, want 0 to 90"},
		{Limits{StressPercent: 101}, "stress_percent: 101, want 1 to 100"},
	} {
		if ps := tt.l.Problems(); !strings.Contains(strings.Join(ps, "\n"), tt.want) {
			t.Errorf("%+v: Problems() = %q, want %q", tt.l, ps, tt.want)
		}
	}
	if ps := (Limits{IPv6PrefixLength: 129}).Problems(); !strings.Contains(ps[len(ps)-1], "129, want 1 to 128") {
		t.Errorf("Problems() = %q", ps)
	}
}
