package config

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// The checks here touch the host, which Validate does not: `config check`
// runs them so that it refuses what `serve` would refuse at start (an
// address that cannot be bound, a queue directory it cannot write, a key
// its user cannot read) instead of passing a file that then fails under
// systemd or in a container. The host is injected, so that tests need no
// particular machine.

// Host is what Preflight uses of the machine.
type Host struct {
	Listen     func(network, address string) (net.Listener, error)      // net.Listen
	LookupHost func(ctx context.Context, host string) ([]string, error) // net.DefaultResolver.LookupHost
	// As is the user the relay will run as: files are checked against
	// its uid and groups (owner, group and mode) rather than opened. Nil:
	// they are opened by this process (as Validate does).
	As *Account
}

// SystemHost is Host for this machine, files checked as user (nil: as
// this process).
func SystemHost(as *Account) Host {
	return Host{Listen: net.Listen, LookupHost: net.DefaultResolver.LookupHost, As: as}
}

// Account is a user whose permissions are checked without switching to
// it.
type Account struct {
	Name   string
	UID    int   // -1: no such user on this host (yet)
	Groups []int // primary group first
}

// LookupAccount finds a user by name or number. A user that does not
// exist is not an error: a systemd unit with DynamicUser= has a user only
// while it runs, so it is checked as one that owns no file and is in no
// group, which is what the service's user is. A number this host does not
// know (a container's user) is checked as that uid, in no group.
func LookupAccount(name string) (*Account, error) {
	u, err := user.Lookup(name)
	uid, numErr := strconv.Atoi(name)
	if err != nil && numErr == nil {
		u, err = user.LookupId(name)
	}
	var unknown user.UnknownUserError
	var unknownID user.UnknownUserIdError
	switch {
	case errors.As(err, &unknownID) || (errors.As(err, &unknown) && numErr == nil):
		return &Account{Name: name, UID: uid}, nil
	case errors.As(err, &unknown):
		return &Account{Name: name, UID: -1}, nil
	case err != nil:
		return nil, fmt.Errorf("user %s: %w", name, err)
	}
	a := &Account{Name: name}
	a.UID, _ = strconv.Atoi(u.Uid)
	gids, _ := u.GroupIds()
	for _, g := range append([]string{u.Gid}, gids...) {
		if n, err := strconv.Atoi(g); err == nil && !slices.Contains(a.Groups, n) {
			a.Groups = append(a.Groups, n)
		}
	}
	return a, nil
}

// String names the account for messages.
func (a *Account) String() string { return "user " + a.Name }

// Note explains how an account that does not exist is checked, or is "".
func (a *Account) Note() string {
	if a.UID >= 0 {
		return ""
	}
	return fmt.Sprintf("user %s does not exist on this host now: checked as a user that owns no file and is in no group "+
		"(what a systemd DynamicUser= is)", a.Name)
}

// may reports whether a has the permission bits want (4 read, 2 write, 1
// search) on a file with info fi. ACLs are not read.
func (a *Account) may(fi fs.FileInfo, want fs.FileMode) bool {
	if a.UID == 0 {
		return true
	}
	perm := fi.Mode().Perm()
	uid, gid, ok := owner(fi)
	switch {
	case !ok:
	case a.UID >= 0 && uid == a.UID:
		return perm>>6&want == want
	case slices.Contains(a.Groups, gid):
		return perm>>3&want == want
	}
	return perm&want == want
}

// Preflight checks what serve needs of the host: every listener and the
// admin address can be bound (one in use is a warning, since the check is
// often run beside the running relay), the source addresses are this
// host's, the queue's directory is writable, every file the relay reads
// is readable by h.As, and the hostname resolves. Its errors, like
// Validate's, name their line.
func (c *Config) Preflight(ctx context.Context, h Host) (warnings []string, err error) {
	var p preflight
	p.host = h
	for i, l := range c.Listeners {
		p.listen(fmt.Sprintf("listeners[%d].address", i), l.Address)
	}
	if c.Admin.Address != "" {
		p.listen("admin.address", c.Admin.Address)
	}
	p.source("delivery.source_ipv4", c.Delivery.SourceIPv4)
	p.source("delivery.source_ipv6", c.Delivery.SourceIPv6)
	p.queue(c.Queue.Path)
	if h.As != nil {
		for _, f := range c.readFiles() {
			p.readable(f.key, f.path)
		}
	}
	if w := c.UnresolvedHostname(ctx, h.LookupHost); w != "" {
		p.warnings = append(p.warnings, w)
	}
	return p.warnings, c.located(p.errs)
}

// SortByLine flattens joined errors and orders them by the line of the
// file they name (those naming none first, in their order), so that
// Validate's and Preflight's problems read top to bottom with the file.
func SortByLine(err error) error {
	var flat []error
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		if e != nil {
			flat = append(flat, e)
		}
	}
	walk(err)
	slices.SortStableFunc(flat, func(a, b error) int { return cmp.Compare(errLine(a), errLine(b)) })
	return errors.Join(flat...)
}

type preflight struct {
	host     Host
	warnings []string
	errs     []error
}

func (p *preflight) fail(format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf(format, args...))
}

// listen binds addr and releases it at once.
func (p *preflight) listen(key, addr string) {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return // Validate reports it
	}
	l, err := p.host.Listen("tcp", addr)
	switch {
	case err == nil:
		l.Close()
	case errors.Is(err, syscall.EADDRINUSE):
		p.warnings = append(p.warnings, fmt.Sprintf("%s: %s is in use (the relay running?)", key, addr))
	case errors.Is(err, syscall.EACCES):
		p.fail("%s: cannot listen on %s: %v (a port below 1024 needs root or CAP_NET_BIND_SERVICE, which the systemd unit grants)", key, addr, err)
	default:
		p.fail("%s: cannot listen on %s: %v", key, addr, err)
	}
}

// source checks that ip is an address of this host: delivery binds it for
// every connection and refuses to start without it, since sending from
// another address would restart every receiver's greylisting clock.
func (p *preflight) source(key, ip string) {
	if net.ParseIP(ip) == nil {
		return // empty, or Validate reports it
	}
	l, err := p.host.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		p.fail("%s: %s is not bindable on this host: %v", key, ip, err)
		return
	}
	l.Close()
}

// queue checks that the queue file can be created or opened for writing:
// its directory, or the nearest one that exists (serve creates the
// rest), must be writable.
func (p *preflight) queue(path string) {
	if path == "" {
		return // Validate reports it
	}
	if err := QueueWritable(path, p.host.As); err != nil {
		p.fail("queue.path: %w", err)
	}
}

// QueueWritable reports why the queue file at path cannot be created or
// written, by as (nil: this process, by creating a file and removing it
// again), or nil. It names the absolute path and what to do: a relative
// path depends on the directory the relay was started from.
func QueueWritable(path string, as *Account) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	dir := filepath.Dir(abs)
	existing := dir
	for {
		if _, err := os.Stat(existing); err == nil || filepath.Dir(existing) == existing {
			break
		}
		existing = filepath.Dir(existing)
	}
	why := queueFix(path, abs)
	if as != nil {
		if err := as.reach(existing, 2|1); err != nil {
			return fmt.Errorf("%s: %w%s", abs, err, why)
		}
		if fi, err := os.Stat(abs); err == nil && !as.may(fi, 4|2) {
			return fmt.Errorf("%s is not readable and writable by %s (%s)%s", abs, as, describe(fi), why)
		}
		return nil
	}
	f, err := os.CreateTemp(existing, ".greyrelay-check-*")
	if err != nil {
		return fmt.Errorf("cannot create %s: %w%s", dir, unwrapPath(err), why)
	}
	f.Close()
	os.Remove(f.Name())
	if f, err := os.OpenFile(abs, os.O_RDWR, 0); err == nil {
		f.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w%s", abs, unwrapPath(err), why)
	}
	return nil
}

// queueFix says what to do about a queue path that cannot be written.
func queueFix(path, abs string) string {
	if filepath.IsAbs(path) {
		return ": make the directory writable by the relay's user, or set queue.path to one that is"
	}
	return fmt.Sprintf(" (queue.path %q is relative to the directory greyrelay was started from): set queue.path to an absolute path "+
		"in a directory the relay's user may write (under systemd, StateDirectory= gives one and relative paths resolve against it)", path)
}

// unwrapPath drops the path an *fs.PathError repeats: the caller names it.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// readFile is one file the relay reads at start.
type readFile struct{ key, path string }

// readFiles lists every file the relay reads: TLS certificates and keys,
// DKIM keys, secrets and CA bundles.
func (c *Config) readFiles() []readFile {
	fs := []readFile{{"users_file", c.UsersFile}, {"admin.token_file", c.Admin.TokenFile},
		{"delivery.tls_ca_file", c.Delivery.TLSCAFile}, {"delivery.smarthost.password_file", c.Delivery.Smarthost.PasswordFile},
		{"cluster.redis.password_file", c.Cluster.Redis.PasswordFile}, {"cluster.redis.tls_ca", c.Cluster.Redis.TLSCA}}
	for i, l := range c.Listeners {
		fs = append(fs, readFile{fmt.Sprintf("listeners[%d].tls_cert", i), l.TLSCert}, readFile{fmt.Sprintf("listeners[%d].tls_key", i), l.TLSKey})
	}
	for dom, d := range c.DKIM.Domains {
		for i, s := range d.Selectors {
			fs = append(fs, readFile{fmt.Sprintf("dkim.domains.%s.selectors[%d].key_file", dom, i), s.KeyFile})
		}
	}
	for i, w := range c.Events.Webhooks {
		fs = append(fs, readFile{fmt.Sprintf("events.webhooks[%d].secret_file", i), w.SecretFile})
	}
	return fs
}

// readable checks that p.host.As may read path (a file that does not
// exist at all is Validate's to report).
func (p *preflight) readable(key, path string) {
	if path == "" {
		return
	}
	fi, err := os.Stat(path)
	if err != nil {
		return
	}
	if err := p.host.As.reach(filepath.Dir(path), 1); err != nil {
		p.fail("%s: %s: %v%s", key, path, err, credentialsFix)
		return
	}
	if !p.host.As.may(fi, 4) {
		p.fail("%s: %s is not readable by %s (%s)%s", key, path, p.host.As, describe(fi), credentialsFix)
	}
}

// credentialsFix says how to give a file to the relay's user.
const credentialsFix = ": give it to that user (chown, or a group it is in and mode 0640), or under systemd hand it over " +
	"with LoadCredential= (docs/operations.md, \"Run it under systemd\")"

// reach checks that a may search every directory from the root down to
// dir, and has want on dir itself.
func (a *Account) reach(dir string, want fs.FileMode) error {
	dir, _ = filepath.Abs(dir)
	var chain []string
	for d := dir; ; d = filepath.Dir(d) {
		chain = append([]string{d}, chain...)
		if filepath.Dir(d) == d {
			break
		}
	}
	for i, d := range chain {
		fi, err := os.Stat(d)
		if err != nil {
			return unwrapPath(err)
		}
		w := fs.FileMode(1)
		if i == len(chain)-1 {
			w = want
		}
		if !a.may(fi, w) {
			what := "enter"
			if w&2 != 0 {
				what = "write in"
			}
			return fmt.Errorf("%s may not %s directory %s (%s)", a, what, d, describe(fi))
		}
	}
	return nil
}

// describe is a file's owner and mode, as ls shows them.
func describe(fi fs.FileInfo) string {
	uid, gid, ok := owner(fi)
	if !ok {
		return fmt.Sprintf("mode %04o", fi.Mode().Perm())
	}
	return fmt.Sprintf("owner %d:%d, mode %04o", uid, gid, fi.Mode().Perm())
}

// UnresolvedHostname warns when hostname, a fully qualified name, does not
// resolve: receivers that check the EHLO name find nothing. A name that
// is not qualified has its warning from Warnings.
func (c *Config) UnresolvedHostname(ctx context.Context, lookup func(context.Context, string) ([]string, error)) string {
	if lookup == nil || !isFQDN(c.Hostname) {
		return ""
	}
	if _, err := lookup(ctx, c.Hostname); err != nil {
		return fmt.Sprintf("hostname: %q does not resolve (%v): receivers that check the EHLO name find no address for it; "+
			"publish an A/AAAA record for it, or set hostname to a name that has one", c.Hostname, err)
	}
	return ""
}
