// Package config loads, overlays and validates greyrelay's configuration.
//
// The defaults are not written in Go: they are configs/default.yaml, the
// commented file embedded in the binary. Load decodes that file first and
// then the operator's file on top of it, so every key is optional and every
// default is documented in one place. Decoding is strict: an unknown key is
// an error that names it. Environment variables (GREYRELAY_…) override
// scalar keys last, and *_file keys read secrets from files, the way Docker
// and Kubernetes hand them out.
//
// Validation refuses what would make the relay unsafe or unbounded: an
// open trusted network (0.0.0.0/0, ::/0), a limit of 0 (go-smtp reads 0 as
// "unlimited"), a submission listener without TLS material, unreadable files.
package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/classifier"
)

// ListenerMode says what a listener is for: smtp takes mail to relay
// (trusted networks or AUTH); submission (STARTTLS, RFC 6409) and
// submissions (implicit TLS, RFC 8314) require AUTH before MAIL.
type ListenerMode string

// Listener modes.
const (
	ModeSMTP        ListenerMode = "smtp"
	ModeSubmission  ListenerMode = "submission"
	ModeSubmissions ListenerMode = "submissions"
)

// Valid reports whether m is one of the listener modes.
func (m ListenerMode) Valid() bool {
	return m == ModeSMTP || m == ModeSubmission || m == ModeSubmissions
}

// TLSMode is the outbound STARTTLS policy of delivery.tls and
// delivery.smarthost.tls. The values are relay/smtpclient's TLSPolicy
// names, so the delivery engine converts one into the other.
type TLSMode string

// TLS modes: never STARTTLS; STARTTLS when offered, certificate not checked
// (opportunistic, RFC 7435); STARTTLS required, certificate not checked;
// STARTTLS required and the certificate verified for the server name.
const (
	TLSNone    TLSMode = "none"
	TLSMay     TLSMode = "may"
	TLSEncrypt TLSMode = "encrypt"
	TLSVerify  TLSMode = "verify"
)

// TLSModes lists the valid TLS modes.
var TLSModes = []TLSMode{TLSNone, TLSMay, TLSEncrypt, TLSVerify}

// Valid reports whether m is one of the TLS modes.
func (m TLSMode) Valid() bool { return slices.Contains(TLSModes, m) }

// DNSSECMode says whether delivery looks up DANE records (RFC 7672): off,
// or trust-ad (believe the AD bit of a loopback or listed resolver).
type DNSSECMode string

// DNSSEC modes.
const (
	DNSSECOff     DNSSECMode = "off"
	DNSSECTrustAD DNSSECMode = "trust-ad"
)

// Valid reports whether m is one of the DNSSEC modes.
func (m DNSSECMode) Valid() bool { return m == DNSSECOff || m == DNSSECTrustAD }

// BareCRPolicy says what happens to a message whose data has a CR that is
// not followed by LF.
type BareCRPolicy string

// Bare-CR policies: replace the CR by a space, or refuse the message.
const (
	BareCRNormalize BareCRPolicy = "normalize"
	BareCRReject    BareCRPolicy = "reject"
)

// Valid reports whether p is one of the bare-CR policies.
func (p BareCRPolicy) Valid() bool { return p == BareCRNormalize || p == BareCRReject }

// Config is the whole configuration. Field names mirror the YAML keys.
type Config struct {
	Hostname        string     `yaml:"hostname"`
	Listeners       []Listener `yaml:"listeners"`
	TrustedNetworks []string   `yaml:"trusted_networks"`
	ProxyProtocol   ProxyProto `yaml:"proxy_protocol"`
	UsersFile       string     `yaml:"users_file"`
	// ForeignHeaderFrom is what happens to a message from an authenticated
	// user whose From or Sender header names an address the user may not
	// send as (relay/smtpd): refuse, or unsigned (relayed without a DKIM
	// signature).
	ForeignHeaderFrom string       `yaml:"foreign_header_from"`
	Limits            Limits       `yaml:"limits"`
	BareCR            BareCRPolicy `yaml:"bare_cr"`
	Postmaster        string       `yaml:"postmaster"`
	Queue             Queue        `yaml:"queue"`
	History           History      `yaml:"history"`
	Admin             Admin        `yaml:"admin"`
	API               API          `yaml:"api"`
	Suppression       Suppression  `yaml:"suppression"`
	UserLimits        UserLimits   `yaml:"user_limits"`
	Log               Log          `yaml:"log"`
	Delivery          Delivery     `yaml:"delivery"`
	Retry             Retry        `yaml:"retry"`
	DSN               DSN          `yaml:"dsn"`
	Probe             Probe        `yaml:"probe"`
	DKIM              DKIM         `yaml:"dkim"`
	Events            Events       `yaml:"events"`
	TLSReporting      TLSReporting `yaml:"tls_reporting"`
	Cluster           Cluster      `yaml:"cluster"`

	warnings []string // what Load changed or ignored (Warnings)
	origin   origin   // where each key was set, for errors that name their line
	// systemHostname: hostname was empty and Load took the system's host
	// name, which is rarely the name receivers should see in EHLO.
	systemHostname bool
}

// Cluster configures sharing destination knowledge and limits with other
// nodes through Redis (relay/cluster). No Redis address: a single node.
type Cluster struct {
	Redis             Redis         `yaml:"redis"`
	NodeName          string        `yaml:"node_name"`
	AdminURL          string        `yaml:"admin_url"`
	DestinationLimits string        `yaml:"destination_limits"` // shared | local
	LeaseTTL          time.Duration `yaml:"lease_ttl"`
}

// Redis is how to reach the shared Redis: one address is a single server,
// several a Redis Cluster; master_name makes them Sentinels.
type Redis struct {
	Addresses     []string      `yaml:"addresses"`
	MasterName    string        `yaml:"master_name"`
	Username      string        `yaml:"username"`
	Password      string        `yaml:"password"`
	PasswordFile  string        `yaml:"password_file"`
	TLS           bool          `yaml:"tls"`
	TLSCA         string        `yaml:"tls_ca"`
	TLSServerName string        `yaml:"tls_server_name"`
	Timeout       time.Duration `yaml:"timeout"`
}

// Listener is one SMTP listening socket.
type Listener struct {
	Address            string       `yaml:"address"`
	Mode               ListenerMode `yaml:"mode"`
	TLSCert            string       `yaml:"tls_cert"`
	TLSKey             string       `yaml:"tls_key"`
	AllowPlaintextAuth bool         `yaml:"allow_plaintext_auth"`
	ProxyProtocol      bool         `yaml:"proxy_protocol"` // every connection starts with a PROXY header from proxy_protocol.trusted
}

// ProxyProto says whose PROXY protocol headers (HAProxy's v1 text or v2
// binary preamble) are believed on listeners that set proxy_protocol.
type ProxyProto struct {
	Trusted       []string      `yaml:"trusted"`
	HeaderTimeout time.Duration `yaml:"header_timeout"`
}

// Limits bounds what one client or all clients together may use.
type Limits struct {
	MaxMessageBytes     int64 `yaml:"max_message_bytes"`
	MaxRecipients       int   `yaml:"max_recipients"`
	MaxConnections      int   `yaml:"max_connections"`
	MaxConnectionsPerIP int   `yaml:"max_connections_per_ip"`
	// Share of MaxConnections (percent) strangers cannot take: kept for
	// trusted_networks and authenticated sessions.
	ReservedConnectionsPercent int `yaml:"reserved_connections_percent"`
	// From this share of MaxConnections (percent), idle strangers get
	// StressCommandTimeout instead of CommandTimeout.
	StressPercent        int           `yaml:"stress_percent"`
	StressCommandTimeout time.Duration `yaml:"stress_command_timeout"`
	CommandTimeout       time.Duration `yaml:"command_timeout"`
	MinDataRate          int           `yaml:"min_data_rate"`
	SessionLifetime      time.Duration `yaml:"session_lifetime"`
	MaxJunkCommands      int           `yaml:"max_junk_commands"`
	MaxReceivedHeaders   int           `yaml:"max_received_headers"`
	MaxAuthFailures      int           `yaml:"max_auth_failures"`
	MaxAuthFailuresPerIP int           `yaml:"max_auth_failures_per_ip"`
	// Failures per (address, user name) per hour before that user is
	// locked for that address.
	MaxAuthFailuresPerUser int `yaml:"max_auth_failures_per_user"`
	// How long each AUTH reply to an address past MaxAuthFailuresPerIP waits.
	AuthDelay        time.Duration `yaml:"auth_delay"`
	IPv6PrefixLength int           `yaml:"ipv6_prefix_length"`
}

// Problems returns what is wrong with l, one message per limit in a fixed
// order, or nil. Every limit must be set: go-smtp and greyrelay read 0 as
// unlimited or never. It is the one check of the limits; Validate and
// smtpd.New both use it.
func (l Limits) Problems() []string {
	var ps []string
	for _, f := range []struct {
		key string
		v   int64
	}{
		{"max_message_bytes", l.MaxMessageBytes}, {"max_recipients", int64(l.MaxRecipients)},
		{"max_connections", int64(l.MaxConnections)}, {"max_connections_per_ip", int64(l.MaxConnectionsPerIP)},
		{"command_timeout", int64(l.CommandTimeout)}, {"min_data_rate", int64(l.MinDataRate)},
		{"session_lifetime", int64(l.SessionLifetime)}, {"max_junk_commands", int64(l.MaxJunkCommands)},
		{"max_received_headers", int64(l.MaxReceivedHeaders)}, {"max_auth_failures", int64(l.MaxAuthFailures)},
		{"max_auth_failures_per_ip", int64(l.MaxAuthFailuresPerIP)},
		{"max_auth_failures_per_user", int64(l.MaxAuthFailuresPerUser)}, {"auth_delay", int64(l.AuthDelay)},
		{"stress_percent", int64(l.StressPercent)}, {"stress_command_timeout", int64(l.StressCommandTimeout)},
	} {
		if f.v <= 0 {
			ps = append(ps, "limits."+f.key+": must be greater than 0 (0 would mean unlimited or never)")
		}
	}
	if l.IPv6PrefixLength < 1 || l.IPv6PrefixLength > 128 {
		ps = append(ps, fmt.Sprintf("limits.ipv6_prefix_length: %d, want 1 to 128", l.IPv6PrefixLength))
	}
	if l.ReservedConnectionsPercent < 0 || l.ReservedConnectionsPercent > 90 {
		ps = append(ps, fmt.Sprintf("limits.reserved_connections_percent: %d, want 0 to 90 (strangers need some room)", l.ReservedConnectionsPercent))
	}
	if l.StressPercent > 100 {
		ps = append(ps, fmt.Sprintf("limits.stress_percent: %d, want 1 to 100", l.StressPercent))
	}

	return ps
}

// Queue configures the persistent queue.
type Queue struct {
	Path        string        `yaml:"path"`
	LockTimeout time.Duration `yaml:"lock_timeout"`
	CommitDelay time.Duration `yaml:"commit_delay"`
	// ReservePercent is the share of the queue's filesystem that intake
	// leaves free for deliveries, DSNs and the operator's actions.
	ReservePercent int `yaml:"reserve_percent"`
}

// History bounds the records kept of finished (delivered, relayed,
// failed) messages, for `queue show` and `queue list -status`.
type History struct {
	Retention   time.Duration `yaml:"retention"`
	MaxMessages int           `yaml:"max_messages"`
}

// Admin configures the admin HTTP server.
type Admin struct {
	Address      string   `yaml:"address"`
	Token        string   `yaml:"token"`
	TokenFile    string   `yaml:"token_file"`
	AllowedHosts []string `yaml:"allowed_hosts"`
	// POST /api/probe: probes running at once, and per client per minute.
	ProbeConcurrency int `yaml:"probe_concurrency"`
	ProbePerMinute   int `yaml:"probe_per_minute"`
}

// API configures the HTTP sending API (relay/sendapi): applications post
// messages with a bearer token instead of holding an SMTP session.
type API struct {
	Address        string        `yaml:"address"` // empty: no sending API
	TLSCert        string        `yaml:"tls_cert"`
	TLSKey         string        `yaml:"tls_key"`
	TokensFile     string        `yaml:"tokens_file"`
	IdempotencyTTL time.Duration `yaml:"idempotency_ttl"`
}

// Suppression configures the suppression list (relay/suppress).
type Suppression struct {
	Enabled bool          `yaml:"enabled"`
	Scope   string        `yaml:"scope"` // global | sender-domain
	TTL     time.Duration `yaml:"ttl"`
	// Action is what intake does with a suppressed recipient: "refuse"
	// it at RCPT, or "bounce" it (accept, then fail it at once with a
	// DSN).
	Action string `yaml:"action"`
	// Imports are files of addresses (one a line) kept on the list while
	// they list them: read at start, on SIGHUP and when they change.
	Imports []string `yaml:"imports"`
}

// Suppression actions (suppression.action).
const (
	SuppressRefuse = "refuse"
	SuppressBounce = "bounce"
)

// UserLimits bounds what each AUTH user and API token may send, in a
// sliding hour and day; 0 is no limit. Overrides gives some identities
// limits of their own instead.
type UserLimits struct {
	MessagesPerHour   int                     `yaml:"messages_per_hour"`
	MessagesPerDay    int                     `yaml:"messages_per_day"`
	RecipientsPerHour int                     `yaml:"recipients_per_hour"`
	RecipientsPerDay  int                     `yaml:"recipients_per_day"`
	Overrides         map[string]UserLimitSet `yaml:"overrides"`
}

// UserLimitSet is one identity's limits (user_limits.overrides); 0 is no
// limit.
type UserLimitSet struct {
	MessagesPerHour   int `yaml:"messages_per_hour"`
	MessagesPerDay    int `yaml:"messages_per_day"`
	RecipientsPerHour int `yaml:"recipients_per_hour"`
	RecipientsPerDay  int `yaml:"recipients_per_day"`
}

// For returns the limits of identity id: its override, or the defaults.
func (u UserLimits) For(id string) UserLimitSet {
	if o, ok := u.Overrides[id]; ok {
		return o
	}
	return UserLimitSet{MessagesPerHour: u.MessagesPerHour, MessagesPerDay: u.MessagesPerDay,
		RecipientsPerHour: u.RecipientsPerHour, RecipientsPerDay: u.RecipientsPerDay}
}

// Any reports whether some identity has a limit.
func (u UserLimits) Any() bool { return u.For("") != (UserLimitSet{}) || len(u.Overrides) > 0 }

// Log configures zap.
type Log struct {
	Format string `yaml:"format"`
	Level  string `yaml:"level"`
}

// Delivery configures the outbound side.
type Delivery struct {
	SourceIPv4                  string            `yaml:"source_ipv4"`
	SourceIPv6                  string            `yaml:"source_ipv6"`
	Port                        int               `yaml:"port"`
	Resolver                    string            `yaml:"resolver"`
	AllowPrivateDestinations    bool              `yaml:"allow_private_destinations"`
	TLS                         TLSMode           `yaml:"tls"`
	DNSSEC                      DNSSECMode        `yaml:"dnssec"`                   // off | trust-ad (DANE, RFC 7672)
	DNSSECTrustedResolvers      []string          `yaml:"dnssec_trusted_resolvers"` // non-loopback resolvers whose AD bit is believed
	MTASTS                      bool              `yaml:"mta_sts"`                  // apply MTA-STS policies (RFC 8461)
	TLSCAFile                   string            `yaml:"tls_ca_file"`              // extra roots for MTA-STS fetches and MX hosts
	MaxConnections              int               `yaml:"max_connections"`
	MaxPerDestination           int               `yaml:"max_per_destination"`
	MaxPerDestinationLocal      int               `yaml:"max_per_destination_local"` // one node's cap under a shared max_per_destination; 0: none
	InitialPerDestination       int               `yaml:"initial_per_destination"`   // connections before a destination accepted or greylisted a message (slow start)
	MaxMessagesPerConnection    int               `yaml:"max_messages_per_connection"`
	ConnectionCacheTime         time.Duration     `yaml:"connection_cache_time"` // keep an idle connection this long for the destination's next message
	MaxRecipientsPerTransaction int               `yaml:"max_recipients_per_transaction"`
	ConnectTimeout              time.Duration     `yaml:"connect_timeout"`
	GreetingTimeout             time.Duration     `yaml:"greeting_timeout"`
	CommandTimeout              time.Duration     `yaml:"command_timeout"`
	DataTimeout                 time.Duration     `yaml:"data_timeout"`
	Chunking                    bool              `yaml:"chunking"`          // BDAT (RFC 3030) when the peer offers CHUNKING
	AddressLiterals             string            `yaml:"address_literals"`  // refuse | deliver
	LineLengthLimit             int               `yaml:"line_length_limit"` // fold longer lines when sending; 0 = never
	MXAddressLimit              int               `yaml:"mx_address_limit"`
	MXSessionLimit              int               `yaml:"mx_session_limit"`
	Smarthost                   Smarthost         `yaml:"smarthost"`
	Routes                      map[string]string `yaml:"routes"`
}

// Smarthost is the single next hop for all mail, when Address is set.
type Smarthost struct {
	Address      string  `yaml:"address"`
	Username     string  `yaml:"username"`
	Password     string  `yaml:"password"`
	PasswordFile string  `yaml:"password_file"`
	TLS          TLSMode `yaml:"tls"`
}

// Retry configures the backoff policy and the classifier's extra rules.
type Retry struct {
	InitialInterval     time.Duration     `yaml:"initial_interval"`
	MaxInterval         time.Duration     `yaml:"max_interval"`
	Factor              float64           `yaml:"factor"`
	Jitter              float64           `yaml:"jitter"`
	GreylistFirstRetry  time.Duration     `yaml:"greylist_first_retry"`
	GreylistSecondRetry time.Duration     `yaml:"greylist_second_retry"`
	HintMin             time.Duration     `yaml:"hint_min"`
	HintMax             time.Duration     `yaml:"hint_max"`
	Lifetime            time.Duration     `yaml:"lifetime"`
	DSNLifetime         time.Duration     `yaml:"dsn_lifetime"` // for DSNs; at most Lifetime (the smaller wins)
	DelayWarnings       []time.Duration   `yaml:"delay_warnings"`
	Rules               []classifier.Rule `yaml:"rules"`
}

// DSN configures delivery status notifications.
type DSN struct {
	MaxReturnedBytes    int `yaml:"max_returned_bytes"`
	MaxPerSenderPerHour int `yaml:"max_per_sender_per_hour"`
}

// Probe configures `greyrelay probe`.
type Probe struct {
	Sender string   `yaml:"sender"`
	DNSBL  []string `yaml:"dnsbl"`
}

// DKIM configures signing at intake (relay/dkim).
type DKIM struct {
	WithoutKey string                `yaml:"without_key"` // relay | refuse
	Domains    map[string]DKIMDomain `yaml:"domains"`     // keys canonical after Load
	// TrustedClients says which From domains a client that relays without
	// AUTH (from trusted_networks) gets signed.
	TrustedClients []DKIMGrant `yaml:"trusted_clients"`
}

// DKIMGrant lets unauthenticated clients from Networks have mail From
// Domains signed; "*" is every domain with a key.
type DKIMGrant struct {
	Networks []string `yaml:"networks"`
	Domains  []string `yaml:"domains"` // canonical after Load, or "*"
}

// DKIMDomain is the signing configuration of one sender (From) domain.
type DKIMDomain struct {
	Selectors []DKIMSelector `yaml:"selectors"`
}

// DKIMSelector is one signing key: every selector of a domain signs.
type DKIMSelector struct {
	Selector  string `yaml:"selector"`
	KeyFile   string `yaml:"key_file"`
	Algorithm string `yaml:"algorithm"` // rsa-sha256 | ed25519-sha256; "": the key's own
}

// TLSReporting configures SMTP TLS reports (RFC 8460, relay/tlsrpt).
type TLSReporting struct {
	Enabled      bool          `yaml:"enabled"`
	Organization string        `yaml:"organization"` // "": the hostname
	Contact      string        `yaml:"contact"`      // "": the postmaster
	From         string        `yaml:"from"`         // "": noreply-tlsrpt@hostname
	Timeout      time.Duration `yaml:"timeout"`
	// AllowPrivateRUA lets https: reports go to addresses that are not
	// public (loopback, private, link-local): off, a domain's record
	// cannot aim the relay at a service inside its network.
	AllowPrivateRUA bool `yaml:"allow_private_rua"`
}

// Events configures the delivery events for applications (relay/events).
type Events struct {
	File      string        `yaml:"file"`
	MaxAge    time.Duration `yaml:"max_age"`
	Tag       string        `yaml:"tag"` // keep | strip
	Timeout   time.Duration `yaml:"timeout"`
	BatchSize int           `yaml:"batch_size"`
	Webhooks  []Webhook     `yaml:"webhooks"`
}

// Webhook is one HTTP receiver of events.
type Webhook struct {
	URL        string   `yaml:"url"`
	Events     []string `yaml:"events"` // empty: every kind
	SecretFile string   `yaml:"secret_file"`
}

// Source is everything Load reads. Keeping the inputs explicit lets tests
// load a configuration without touching the process environment.
type Source struct {
	Default  []byte                       // the embedded configs/default.yaml
	File     []byte                       // the operator's file; nil for none
	FileName string                       // for error messages
	Getenv   func(string) (string, bool)  // os.LookupEnv, or nil for none
	ReadFile func(string) ([]byte, error) // os.ReadFile, for *_file keys
	Hostname func() (string, error)       // os.Hostname
	Environ  func() []string              // os.Environ, to find GREYRELAY_ variables that name no key; nil for none
}

// Load builds the effective configuration: defaults, then the file, then
// the environment, then secrets from files. It does not validate; call
// Validate (config check does both). An error lists every problem found
// in the file and the environment; the configuration returned with it is
// what could be read (a key with a problem keeps its default), so that
// Validate can report the remaining problems in the same run.
func Load(src Source) (*Config, error) {
	var c Config
	if err := decodeStrict(src.Default, &c); err != nil {
		return nil, fmt.Errorf("embedded default: %w", err)
	}
	var errs []error
	c.origin = origin{file: src.FileName, lines: keyLines(src.File), env: map[string]bool{}}
	getenv := src.Getenv
	if getenv != nil {
		getenv = func(name string) (string, bool) {
			v, ok := src.Getenv(name)
			c.origin.env[name] = c.origin.env[name] || ok
			return v, ok
		}
	}
	if len(bytes.TrimSpace(src.File)) > 0 {
		// A file that sets listeners replaces the default list rather than
		// merging index by index: yaml decodes into a fresh slice.
		if err := decodeStrict(src.File, &c); err != nil {
			for _, e := range splitErrors(err) {
				errs = append(errs, fmt.Errorf("%s: %w", src.FileName, e))
			}
		}
	}
	if src.Environ != nil {
		errs = append(errs, checkEnv(src.Environ())...)
	}
	if getenv != nil {
		if err := applyEnv(&c, getenv); err != nil {
			errs = append(errs, err)
		}
		c.Queue.Path = inStateDirectory(c.Queue.Path, src.Getenv)
	}
	defaultListenerModes(c.Listeners)
	readSecrets(&c, src.ReadFile)
	if c.Hostname == "" && src.Hostname != nil {
		h, err := src.Hostname()
		if err != nil {
			errs = append(errs, fmt.Errorf("hostname: %w", err))
		}
		c.Hostname, c.systemHostname = h, true
	}
	c.dropLateWarnings()
	errs = append(errs, c.canonicalDomains()...)
	return &c, errors.Join(errs...)
}

// inStateDirectory resolves a relative queue path against
// $STATE_DIRECTORY, which systemd sets for a unit with StateDirectory=
// (the first of a colon-separated list), so that the relay's state does
// not depend on the directory it was started from. Without it a relative
// path stays relative to the working directory: `go run ./cmd/greyrelay`
// keeps its queue beside the source.
func inStateDirectory(path string, getenv func(string) (string, bool)) string {
	dir, ok := getenv("STATE_DIRECTORY")
	dir, _, _ = strings.Cut(dir, ":")
	if !ok || dir == "" || path == "" || filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(dir, path)
}

// defaultListenerModes gives a listener without a mode the default one,
// smtp. A file that sets listeners replaces the embedded list, so a field
// it leaves out is not taken from the default's entry; mode is the one
// listener key whose zero value is not its default, and every key is
// optional.
func defaultListenerModes(ls []Listener) {
	for i := range ls {
		if ls[i].Mode == "" {
			ls[i].Mode = ModeSMTP
		}
	}
}

// LoadFile is Load with the process's environment and files: what
// `greyrelay serve` and `config check` use. An empty path means no file.
func LoadFile(def []byte, path string) (*Config, error) {
	src := Source{Default: def, FileName: path, Getenv: os.LookupEnv,
		ReadFile: os.ReadFile, Hostname: os.Hostname, Environ: os.Environ}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		src.File = b
	}
	return Load(src)
}

// decodeStrict decodes one YAML file onto c and reports every problem it
// finds, each with its line: a syntax error (alone, since nothing after it
// can be read), unknown keys, durations that do not parse and values of
// the wrong type. Fields with a problem keep what they had.
func decodeStrict(b []byte, c *Config) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return syntaxError(b, err)
	}
	if len(doc.Content) == 0 {
		return nil
	}
	k := keyChecker{all: allKeyPaths(reflect.TypeOf(Config{}), "")}
	k.walk(&doc, reflect.TypeOf(Config{}), "")
	errs := k.errs
	if err := doc.Decode(c); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return errors.Join(append(errs, errors.New(nameKeys(friendlyYAMLError(err.Error()), b)))...)
		}
		for _, e := range te.Errors {
			errs = append(errs, errors.New(nameKeys(friendlyYAMLError(e), b)))
		}
	}
	slices.SortStableFunc(errs, func(a, b error) int { return cmp.Compare(errLine(a), errLine(b)) })
	return errors.Join(errs...)
}

// splitErrors returns the parts of a joined error, or err alone.
func splitErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// errLine is the line an error names, for listing a file's errors in order.
func errLine(err error) int {
	m := lineRef.FindStringSubmatch(err.Error() + " ")
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

var lineRef = regexp.MustCompile(`line (\d+)[: ]`)

// nameKeys adds the key to yaml's "line N: cannot unmarshal …" messages, so
// that every error names the key the operator has to fix.
func nameKeys(msg string, src []byte) string {
	lines := strings.Split(string(src), "\n")
	return lineRef.ReplaceAllStringFunc(msg, func(m string) string {
		if !strings.HasSuffix(m, ":") {
			return m // already names its key
		}
		n, _ := strconv.Atoi(lineRef.FindStringSubmatch(m)[1])
		if n < 1 || n > len(lines) {
			return m
		}
		key, _, ok := strings.Cut(strings.TrimLeft(lines[n-1], " -"), ":")
		if !ok || strings.ContainsAny(key, " {[") {
			return m
		}
		return fmt.Sprintf("line %d (key %s):", n, key)
	})
}

// friendlyYAMLError turns yaml's "field x not found in type config.Limits"
// into "unknown key x", which is what an operator needs to read.
func friendlyYAMLError(s string) string {
	s = strings.TrimPrefix(s, "yaml: ")
	if i := strings.Index(s, "field "); i >= 0 && strings.Contains(s, " not found in type ") {
		rest := s[i+len("field "):]
		key := rest[:strings.Index(rest, " not found")]
		return s[:i] + "unknown key " + key
	}
	return s
}

// readSecrets fills secrets from their *_file keys. A file that cannot be
// read is left for Validate to report together with every other problem,
// rather than stopping the load at the first one.
func readSecrets(c *Config, read func(string) ([]byte, error)) {
	if read == nil {
		read = os.ReadFile
	}
	pairs := []struct {
		file string
		dst  *string
	}{
		{c.Admin.TokenFile, &c.Admin.Token},
		{c.Delivery.Smarthost.PasswordFile, &c.Delivery.Smarthost.Password},
		{c.Cluster.Redis.PasswordFile, &c.Cluster.Redis.Password},
	}
	for _, p := range pairs {
		if p.file == "" {
			continue
		}
		if b, err := read(p.file); err == nil {
			*p.dst = strings.TrimRight(string(b), "\r\n")
		}
	}
}

// NodeName is the name this node goes by in the cluster registry, in
// events and in log lines: cluster.node_name, or else the hostname.
func (c *Config) NodeName() string { return cmp.Or(c.Cluster.NodeName, c.Hostname) }
