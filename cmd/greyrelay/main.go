// Command greyrelay is the relay's single binary. This file only parses the
// command line and hands over to the subcommand; serve.go wires the packages
// together. No business logic lives here.
//
//	greyrelay [serve] [-config FILE]     run the relay (the default subcommand)
//	greyrelay config check [-config FILE] [-user NAME]  validate a configuration against this host (exit 2 if bad)
//	greyrelay config default             print the complete default configuration
//	greyrelay user add NAME [SENDER...]  read a password on stdin, print a users-file line
//	greyrelay token add -file F NAME …   append a sending-API token's line to F, print the token
//	greyrelay queue list|show|shape|retry|hold|release|delete|bounce|requeue|salvage …
//	greyrelay destinations [forget|suspend|resume]  what greyrelay learned about destinations; forget it; stop and resume delivery
//	greyrelay suppression list|add|remove the suppression list
//	greyrelay probe ADDRESS|DOMAIN       diagnose the delivery path to a destination
//	greyrelay dkim keygen DOMAIN SELECTOR write a DKIM key, print its DNS record
//	greyrelay health                     exit 0 when the running relay is healthy
//	greyrelay cluster status             the nodes sharing this node's Redis (exit 2 on a name conflict)
//	greyrelay version
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"
)

// exitError carries the process exit status out of a subcommand.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	err := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	if err == nil {
		return
	}
	if !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "greyrelay:", err)
	}
	var ee *exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	os.Exit(1)
}

// run dispatches a subcommand. Streams are passed in so that commands can be
// tested without a process.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(stdout, usage)
		return nil
	}
	args = configFirst(args)
	if len(args) == 0 || len(args[0]) > 0 && args[0][0] == '-' {
		return serve(args, stderr)
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(rest, stderr)
	case "config":
		return configCmd(rest, stdout, stderr)
	case "user":
		return userCmd(rest, stdin, stdout)
	case "token":
		return tokenCmd(rest, stdout)
	case "suppression":
		return suppressionCmd(rest, stdout, stderr)
	case "queue":
		return queueCmd(rest, stdout, stderr)
	case "destinations":
		return destinationsCmd(rest, stdout, stderr)
	case "health":
		return healthCmd(rest, stdout, stderr)
	case "probe":
		return probeCmd(rest, stdout, stderr)
	case "dkim":
		return dkimCmd(rest, stdout, stderr)
	case "cluster":
		return clusterCmd(rest, stdout, stderr)
	case "tls-report":
		return tlsReportCmd(rest, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "greyrelay", version())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return &exitError{2, fmt.Errorf("unknown command %q\n%s", cmd, usage)}
}

// configFirst moves a -config FILE given anywhere on the command line to
// where the subcommand reads it (its first argument; after the second word
// for config check and queue salvage), so that `queue list -json -config F` works like
// `queue -config F list -json`. Commands that read no configuration
// (user, dkim, version) ignore it. Nothing after "--" is looked at.
func configFirst(args []string) []string {
	var path string
	var rest []string
	found := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" || !hasValue && i+1 == len(args) {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			i++
			value = args[i]
		}
		path, found = value, true
	}
	if !found {
		return args
	}
	flag := []string{"-config", path}
	switch {
	case len(rest) == 0 || strings.HasPrefix(rest[0], "-"):
		return append(flag, rest...) // serve, the default command
	case len(rest) > 1 && (rest[0] == "config" || rest[0] == "queue" && rest[1] == "salvage"):
		// config check and queue salvage read -config themselves, after
		// their second word (salvage runs offline, without the admin API)
		return slices.Concat(rest[:2], flag, rest[2:])
	case rest[0] == "user" || rest[0] == "token" || rest[0] == "dkim" || rest[0] == "version" || rest[0] == "help":
		return rest
	}
	return slices.Concat(rest[:1], flag, rest[1:])
}

const usage = `usage:
  greyrelay [serve] [-config FILE] [-check-queue]
                                        run the relay (no file: the embedded default, loopback only);
                                        -check-queue decodes every queue record at start first
  greyrelay config check [-config FILE] [-user NAME]
                                        validate a configuration and check it against this host as serve
                                        would use it (addresses, queue directory, files readable by NAME)
  greyrelay config default              print the complete default configuration
  greyrelay user add NAME [SENDER...]   read a password on stdin, print a users-file line;
                                        SENDER: an address, *@domain or <> this user may send as
                                        (default: any address no other user lists)
  greyrelay token add -file FILE NAME [SENDER...]
                                        make a sending-API token: append its hashed line to FILE
                                        (api.tokens_file) and print the token
  greyrelay queue list [-status S] [-reason R] [-domain D] [-sender S] [-tag T] [-envid E]
                       [-message-id M] [-older-than DUR] [-json] [-cluster]
                                        -tag, -envid, -message-id also list finished messages (history)
                                        -cluster: every node registered in cluster.redis, through its admin API
  greyrelay queue show ID
  greyrelay queue show [-json] -tag T | -envid E | -message-id M   every message so named, queued or finished
  greyrelay queue retry|hold|release|delete|bounce|requeue [-dry-run] ID | SELECTION | -all
                                        SELECTION: -domain D, -status S, -reason R, -sender S, -tag T,
                                        -older-than DUR (all must match); -dry-run only counts
  greyrelay queue show -headers|-body [-max N] [-raw] ID    a message's content (postcat)
  greyrelay queue show -cluster [-json] ID  the message on whichever registered node holds it
  greyrelay queue shape [-by domain|reason] [-json]         the queue by destination and age (qshape)
  greyrelay queue salvage -config FILE  copy what can be read of a damaged queue file into a fresh
                                        one (relay stopped); keeps the damaged file aside
  greyrelay destinations [-json] [DOMAIN]
  greyrelay suppression list [-json] | add [-scope D] [-reason R] [-ttl DUR] ADDRESS | remove [-scope D] ADDRESS
  greyrelay suppression import [-scope D] [-reason R] [-ttl DUR] FILE
                                        recipients refused at RCPT after a permanent address failure
  greyrelay destinations forget DOMAIN | -all
  greyrelay destinations suspend [-reason TEXT] [-for DUR] DOMAIN
                                        stop delivery to DOMAIN (all nodes); its mail stays queued
  greyrelay destinations resume DOMAIN  deliver to it again; its waiting mail is due at once
  greyrelay probe [-config FILE] [-json] [-from SENDER] ADDRESS|DOMAIN
                                        -from also checks SPF, DKIM and DMARC of SENDER's domain
  greyrelay dkim keygen [-algorithm rsa2048|ed25519] [-out FILE] DOMAIN SELECTOR
                                        write a DKIM private key (mode 0600), print its DNS TXT record
  greyrelay health [-config FILE]
  greyrelay cluster status [-config FILE] [-json]
                                        the nodes registered in cluster.redis (name, admin URL, queue);
                                        exit 2 when two running nodes share a node name
  greyrelay tls-report send [-config FILE]
                                        send the TLS reports (RFC 8460) of what was counted so far
  greyrelay version
  greyrelay help | -h                   this list

Every command that reads the configuration takes -config FILE anywhere on
its command line; without it, $GREYRELAY_CONFIG names the file (empty: the
embedded default), else /etc/greyrelay/greyrelay.yaml if it exists, else
the embedded default is used; the command says which on stderr.
GREYRELAY_* variables override single keys (GREYRELAY_RETRY_LIFETIME=3d);
one that names no key is an error.
`

// version reports the module version and VCS revision the binary was built from.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}
