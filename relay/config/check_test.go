package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/configs"
)

// A file with several mistakes gets all of them in one run, in line order,
// each at its own line.
func TestLoad_ReportsEveryErrorAtItsLine(t *testing.T) {
	file := "hostname: relay.test\n" +
		"hostnme: x\n" + // 2: unknown key
		"retry:\n" +
		"  lifetime: 5 minutes\n" + // 4: duration
		"limits:\n" +
		"  max_recipients: many\n" + // 6: type
		"  max_mesage_bytes: 10\n" // 7: unknown key
	c, err := load(t, file, map[string]string{"GREYRELAY_RETRY_INITAL_INTERVAL": "1s"})
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		"test.yaml: line 2: unknown key hostnme (did you mean hostname?)",
		"test.yaml: line 4 (key retry.lifetime): \"5 minutes\" is not a duration: write a number and a unit without spaces",
		"test.yaml: line 6 (key max_recipients): cannot unmarshal",
		"test.yaml: line 7: unknown key limits.max_mesage_bytes (did you mean limits.max_message_bytes?)",
		"environment GREYRELAY_RETRY_INITAL_INTERVAL: not a greyrelay setting (did you mean GREYRELAY_RETRY_INITIAL_INTERVAL?)",
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("error %d = %q, want it to start with %q", i+1, lines[i], w)
		}
	}
	// What could be read is returned, for Validate to check the rest.
	if c == nil || c.Hostname != "relay.test" || c.Retry.Lifetime != 120*time.Hour {
		t.Errorf("partial configuration = %+v", c)
	}
}

// yaml names the line where the enclosing block began; the error must name
// the line with the mistake.
func TestLoad_SyntaxErrorLine(t *testing.T) {
	cases := []struct {
		file string
		line string
	}{
		{"listeners:\n  - address: 127.0.0.1:25\n   mode: smtp\n", "line 3:"},
		{"retry:\n  lifetime: 1h\n initial_interval: 1s\n", "line 3:"},
		{"hostname: a\n\n\nlog:\n  level: info\n    format: json\n", "line 6:"},
		{"hostname: a\nadmin:\n\taddress: x\n", "line 3:"},
		{"trusted_networks: [127.0.0.0/8,\n  10.0.0.0/8\nhostname: x\n", "line 1:"},
	}
	for _, tc := range cases {
		_, err := load(t, tc.file, nil)
		if err == nil || !strings.HasPrefix(err.Error(), "test.yaml: "+tc.line) {
			t.Errorf("%q: err = %v, want it at %s", tc.file, err, tc.line)
		}
	}
	_, err := load(t, "hostname: a\nadmin:\n\taddress: x\n", nil)
	if err == nil || !strings.Contains(err.Error(), "not tabs") {
		t.Errorf("tab indentation: err = %v, want a hint about tabs", err)
	}
	_, err = load(t, "listeners:\n  - address: 127.0.0.1:25\n   mode: smtp\n", nil)
	if err == nil || !strings.Contains(err.Error(), "indentation") {
		t.Errorf("indentation: err = %v, want a hint", err)
	}
}

func TestLoad_DidYouMean(t *testing.T) {
	cases := []struct{ file, want string }{
		{"retry:\n  initial_intervl: 1s\n", "did you mean retry.initial_interval?"},
		{"lifetime: 1h\n", "did you mean retry.lifetime?"},
		{"listeners:\n  - address: 127.0.0.1:25\n    mdoe: smtp\n", "unknown key listeners[0].mdoe (did you mean listeners[0].mode?)"},
		{"delivery:\n  smarthost:\n    adress: x\n", "did you mean delivery.smarthost.address?"},
		{"completely_unrelated: 1\n", "unknown key completely_unrelated\n"},
	}
	for _, tc := range cases {
		_, err := load(t, tc.file, nil)
		if err == nil || !strings.Contains(err.Error()+"\n", tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.file, err, tc.want)
		}
	}
}

func TestLoad_DurationsInDays(t *testing.T) {
	c, err := load(t, "history:\n  retention: 14d\nretry:\n  lifetime: 3d\n  delay_warnings: [4h, 1d]\n",
		map[string]string{"GREYRELAY_RETRY_DSN_LIFETIME": "2d"})
	if err != nil {
		t.Fatal(err)
	}
	if c.History.Retention != 14*24*time.Hour || c.Retry.Lifetime != 72*time.Hour || c.Retry.DSNLifetime != 48*time.Hour ||
		!reflect.DeepEqual(c.Retry.DelayWarnings, []time.Duration{4 * time.Hour, 24 * time.Hour}) {
		t.Errorf("retention %v lifetime %v dsn_lifetime %v warnings %v", c.History.Retention, c.Retry.Lifetime,
			c.Retry.DSNLifetime, c.Retry.DelayWarnings)
	}
	if _, err := load(t, "", map[string]string{"GREYRELAY_RETRY_LIFETIME": "5 days"}); err == nil ||
		!strings.Contains(err.Error(), "GREYRELAY_RETRY_LIFETIME") || !strings.Contains(err.Error(), "2d") {
		t.Errorf("environment duration with a space: err = %v", err)
	}
}

func TestLoad_UnknownEnvironment(t *testing.T) {
	cases := []struct {
		name, want string
	}{
		{"GREYRELAY_RETRY_INITAL_INTERVAL", "did you mean GREYRELAY_RETRY_INITIAL_INTERVAL?"},
		{"GREYRELAY_LISTENERS_1_ADRESS", "did you mean GREYRELAY_LISTENERS_1_ADDRESS?"},
		{"GREYRELAY_QUEUE", "not a greyrelay setting"},
	}
	for _, tc := range cases {
		_, err := load(t, "", map[string]string{tc.name: "x"})
		if err == nil || !strings.Contains(err.Error(), "environment "+tc.name+": ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := load(t, "", map[string]string{"GREYRELAY_CONFIG": "/x", "GREYRELAY_LISTENERS_1_ADDRESS": "127.0.0.1:2", "OTHER": "y"}); err != nil {
		t.Errorf("known variables refused: %v", err)
	}
}

func TestWarnings(t *testing.T) {
	const users = "users_file: config_test.go\n"
	cases := []struct{ name, file, want string }{
		{"public, nobody may relay", "listeners:\n  - {address: 0.0.0.0:25, mode: smtp}\n", "listeners[0]: 0.0.0.0:25 accepts connections from other hosts, but none of them may send"},
		{"users without TLS", users + "listeners:\n  - {address: 192.0.2.1:25, mode: smtp}\n", "only after STARTTLS"},
		{"users with TLS", users + "listeners:\n  - {address: 0.0.0.0:25, mode: smtp, tls_cert: c, tls_key: k}\n", ""},
		{"users behind a TLS proxy", users + "listeners:\n  - {address: 0.0.0.0:25, mode: smtp, allow_plaintext_auth: true}\n", ""},
		{"trusted network", "trusted_networks: [10.0.0.0/8]\nlisteners:\n  - {address: 0.0.0.0:25, mode: smtp}\n", ""},
		{"loopback listener", "listeners:\n  - {address: 127.0.0.1:25, mode: smtp}\n", ""},
		{"AUTH in clear behind PROXY", users + "proxy_protocol: {trusted: [127.0.0.1/32]}\nlisteners:\n  - {address: 127.0.0.1:25, mode: smtp, proxy_protocol: true, allow_plaintext_auth: true}\n",
			"listeners[0]: 127.0.0.1:25 has proxy_protocol and allow_plaintext_auth: AUTH PLAIN/LOGIN is offered before STARTTLS"},
		{"AUTH after STARTTLS behind PROXY", users + "proxy_protocol: {trusted: [127.0.0.1/32]}\nlisteners:\n  - {address: 127.0.0.1:25, mode: smtp, proxy_protocol: true}\n", ""},
		{"default", "", ""},
		{"cluster node without a name", "hostname: relay.test\ncluster:\n  redis: {addresses: ['127.0.0.1:6379']}\n", `cluster.node_name is empty: this node registers as "relay.test"`},
		{"named cluster node", "cluster:\n  redis: {addresses: ['127.0.0.1:6379']}\n  node_name: a\n", ""},
		{"late delay warning", "retry:\n  lifetime: 12h\n  delay_warnings: [4h, 1d]\n", "retry.delay_warnings: 24h0m0s is not before retry.lifetime (12h0m0s), when the message bounces: dropped"},
		// The EHLO name: the embedded default sets none.
		{"hostname unset", "hostname: \"\"\n", `hostname is not set: the relay names itself "relay.test" (the system's host name; in a container, its ID)`},
		{"hostname not qualified", "hostname: vm\n", `hostname: "vm" is not a fully qualified domain name`},
		{"hostname an address", "hostname: 192.0.2.1\n", `hostname: "192.0.2.1" is not a fully qualified domain name`},
		{"hostname with a trailing dot", "hostname: relay.test.\n", ""},
	}
	for _, tc := range cases {
		file := tc.file
		if !strings.Contains(file, "hostname:") {
			file = "hostname: relay.test\n" + file // the other cases test one warning each
		}
		c, err := load(t, file, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := strings.Join(c.Warnings(), "\n")
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%s: warnings %q, want %q", tc.name, got, tc.want)
		}
	}
	c, _ := load(t, "retry:\n  lifetime: 12h\n  delay_warnings: [4h, 1d]\n", nil)
	if err := c.Validate(); err != nil || !reflect.DeepEqual(c.Retry.DelayWarnings, []time.Duration{4 * time.Hour}) {
		t.Errorf("late delay warning: Validate() = %v, warnings kept %v; want valid with [4h]", err, c.Retry.DelayWarnings)
	}
}

// FuzzLoad: no file makes loading or validating panic, and a file that
// loads without error has no problem the loader should have reported.
func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		"", "hostname: x\n", "listeners:\n  - address: 127.0.0.1:25\n   mode: smtp\n",
		"retry:\n  lifetime: 5 minutes\n  delay_warnings: [1d, 2h]\n", "a: &x [1]\nb: *x\n",
		"dkim:\n  domains:\n    example.com:\n      selectors: [{selector: s}]\n", "limits: {max_recipients: many}\n",
		"listeners: [{address: '0.0.0.0:25', mode: smtp}]\n", "{[\n", "history:\n  retention: !!int 3\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, file string) {
		c, err := Load(Source{Default: configs.Default, File: []byte(file), FileName: "f.yaml",
			Hostname: func() (string, error) { return "relay.test", nil }})
		if err == nil && c == nil {
			t.Fatal("no configuration and no error")
		}
		if c != nil {
			_ = c.Warnings()
		}
	})
}

// Validation errors name the line of their key (or of the nearest
// enclosing key the file sets), or the environment variable that set it;
// a key left at its default has no line to name.
func TestValidate_ErrorsNameTheirLine(t *testing.T) {
	file := "hostname: relay.test\n" + // 1
		"listeners:\n" + // 2
		"  - address: 127.0.0.1:2525\n" + // 3
		"  - address: 127.0.0.1:2526\n" + // 4
		"    mode: smtps\n" + // 5
		"limits:\n" + // 6
		"  max_connections: 0\n" + // 7
		"delivery:\n" + // 8
		"  smarthost:\n" + // 9
		"    username: u\n" // 10
	c, err := load(t, file, map[string]string{"GREYRELAY_QUEUE_LOCK_TIMEOUT": "0s"})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	if err == nil {
		t.Fatal("valid")
	}
	for _, want := range []string{
		`test.yaml: line 5: listeners[1].mode: "smtps" is not one of`,
		"test.yaml: line 7: limits.max_connections: must be greater than 0",
		"test.yaml: line 9: delivery.smarthost: username without password",
		"environment GREYRELAY_QUEUE_LOCK_TIMEOUT: queue.lock_timeout: must be greater than 0",
	} {
		if !strings.Contains(err.Error()+"\n", want) {
			t.Errorf("errors lack %q:\n%v", want, err)
		}
	}
	// The default's own keys are not in the file: no line.
	c, _ = load(t, "hostname: relay.test\n", map[string]string{"GREYRELAY_HISTORY_MAX_MESSAGES": "0"})
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "environment GREYRELAY_HISTORY_MAX_MESSAGES: history.max_messages") {
		t.Errorf("environment error: %v", err)
	}
}

// A relative queue.path resolves against $STATE_DIRECTORY (systemd's
// StateDirectory=), so that the relay's state does not depend on the
// directory it was started from; without it, it stays relative.
func TestLoad_QueuePathInStateDirectory(t *testing.T) {
	cases := []struct {
		file string
		env  map[string]string
		want string
	}{
		{"", map[string]string{"STATE_DIRECTORY": "/var/lib/greyrelay"}, "/var/lib/greyrelay/greyrelay-data/queue.db"},
		{"queue:\n  path: queue.db\n", map[string]string{"STATE_DIRECTORY": "/var/lib/greyrelay:/var/lib/other"}, "/var/lib/greyrelay/queue.db"},
		{"queue:\n  path: /srv/q/queue.db\n", map[string]string{"STATE_DIRECTORY": "/var/lib/greyrelay"}, "/srv/q/queue.db"},
		{"", map[string]string{"STATE_DIRECTORY": "/var/lib/greyrelay", "GREYRELAY_QUEUE_PATH": "q.db"}, "/var/lib/greyrelay/q.db"},
		{"", nil, "./greyrelay-data/queue.db"},
		{"", map[string]string{"STATE_DIRECTORY": ""}, "./greyrelay-data/queue.db"},
	}
	for _, tc := range cases {
		c, err := load(t, tc.file, tc.env)
		if err != nil {
			t.Fatal(err)
		}
		if c.Queue.Path != tc.want {
			t.Errorf("%q with %v: queue.path = %q, want %q", tc.file, tc.env, c.Queue.Path, tc.want)
		}
	}
}

// QueueWritable names the absolute path and, for a relative one, that it
// depends on the working directory, without repeating the path.
func TestQueueWritable(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "greyrelay-data")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	err := QueueWritable("./greyrelay-data/queue.db", nil)
	if err == nil {
		t.Fatal("a queue under a regular file: no error")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "cannot create "+blocker+": ") || !strings.Contains(msg, "relative to the directory greyrelay was started from") ||
		strings.Count(msg, blocker) != 1 {
		t.Errorf("error = %q", msg)
	}
	if err := QueueWritable(filepath.Join(dir, "q", "queue.db"), nil); err != nil {
		t.Errorf("a writable directory: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the check left files behind: %v", entries)
	}
}
