package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/smtpd"
)

// defaultConfigPath is where the example configuration, the systemd
// unit and the documentation put the file: a command run on the relay's
// host without -config finds the running relay's configuration there.
const defaultConfigPath = "/etc/greyrelay/greyrelay.yaml"

// configChoice is the configuration file a command reads ("" for the
// embedded default) and why that one.
type configChoice struct{ path, why string }

// chooseConfig picks the file: -config, else $GREYRELAY_CONFIG (set but
// empty: the embedded default, which is how a test or a script says "no
// file"), else defaultConfigPath when it exists, else the embedded
// default. The environment and the file system are passed in so that
// tests need not own /etc.
func chooseConfig(flagPath string, lookupEnv func(string) (string, bool), exists func(string) bool) configChoice {
	if flagPath != "" {
		return configChoice{flagPath, "-config"}
	}
	if p, ok := lookupEnv(config.EnvConfigFile); ok {
		if p == "" {
			return configChoice{"", "$" + config.EnvConfigFile + " is empty"}
		}
		return configChoice{p, "$" + config.EnvConfigFile}
	}
	if exists(defaultConfigPath) {
		return configChoice{defaultConfigPath, "the default path"}
	}
	return configChoice{"", "no -config, no $" + config.EnvConfigFile + ", no " + defaultConfigPath}
}

// String is the line a command prints on stderr (stdout stays clean for
// -json).
func (c configChoice) String() string {
	if c.path == "" {
		return fmt.Sprintf("using the embedded default configuration (%s)", c.why)
	}
	return fmt.Sprintf("using configuration %s (%s)", c.path, c.why)
}

// fileExists is false only for a file that is not there: one this user
// may not see is reported when it is read, rather than silently replaced
// by the embedded default.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// loadConfig is the one way every subcommand reads its configuration:
// chooseConfig's file, said on stderr when stderr is not nil, read and
// validated by readConfig.
func loadConfig(flagPath string, stderr io.Writer) (*config.Config, configChoice, error) {
	choice := chooseConfig(flagPath, os.LookupEnv, fileExists)
	if stderr != nil {
		fmt.Fprintln(stderr, "greyrelay:", choice)
	}
	c, err := readConfig(choice.path)
	return c, choice, err
}

// readConfig reads the file at path ("": none) over the embedded default,
// then the environment, and validates the result.
func readConfig(path string) (*config.Config, error) {
	c, err := config.LoadFile(configs.Default, path)
	if c == nil {
		return nil, &exitError{2, err}
	}
	// Validate what could be read too: every problem in one run.
	if err := errors.Join(err, c.Validate()); err != nil {
		return nil, &exitError{2, fmt.Errorf("invalid configuration:\n%w", err)}
	}
	return c, nil
}

func configCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return &exitError{2, errors.New("usage: greyrelay config check [-config FILE] [-user NAME] | config default")}
	}
	switch args[0] {
	case "default":
		_, err := stdout.Write(configs.Default)
		return err
	case "check":
		return configCheck(args[1:], stdout, stderr)
	}
	return &exitError{2, fmt.Errorf("unknown config subcommand %q", args[0])}
}

// configCheck validates a configuration and then checks it against this
// host the way serve would use it (config.Preflight): every error of the
// file, the environment and the host in one run, exit status 2 if any.
func configCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration file to check (default: $GREYRELAY_CONFIG, else "+defaultConfigPath+" if it exists)")
	userName := fs.String("user", "", "check the files the relay reads against this user's permissions (the user serve runs as)")
	if err := fs.Parse(args); err != nil {
		return &exitError{2, err}
	}
	if *path == "" && fs.NArg() == 1 {
		*path = fs.Arg(0)
	}
	var as *config.Account
	if *userName != "" {
		a, err := config.LookupAccount(*userName)
		if err != nil {
			return &exitError{2, err}
		}
		as = a
		if n := a.Note(); n != "" {
			fmt.Fprintln(stderr, "greyrelay:", n)
		}
	}
	choice := chooseConfig(*path, os.LookupEnv, fileExists)
	c, err := config.LoadFile(configs.Default, choice.path)
	if c == nil {
		return &exitError{2, err}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	warnings, hostErr := c.Preflight(ctx, config.SystemHost(as))
	if err := config.SortByLine(errors.Join(err, c.Validate(), hostErr)); err != nil {
		printWarnings(stderr, append(c.Warnings(), warnings...))
		return &exitError{2, fmt.Errorf("invalid configuration:\n%w", err)}
	}
	printWarnings(stderr, append(c.Warnings(), warnings...))
	fmt.Fprintf(stdout, "%s: configuration is valid\n", displayName(choice.path))
	return nil
}

func printWarnings(w io.Writer, warnings []string) {
	for _, s := range warnings {
		fmt.Fprintln(w, "warning:", s)
	}
}

func displayName(path string) string {
	if path == "" {
		return "(embedded default)"
	}
	return path
}

// userCmd prints a users-file line; the password is read from stdin so that
// it never appears in the process list or shell history. The allowed
// senders are the arguments after NAME (and, as before, -sender's list).
func userCmd(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) < 2 || args[0] != "add" {
		return &exitError{2, errors.New("usage: greyrelay user add NAME [SENDER...] < password")}
	}
	fs := flag.NewFlagSet("user add", flag.ContinueOnError)
	senders := fs.String("sender", "", "comma-separated senders this user may use (default: any)")
	name := args[1]
	var allowed []string
	// Flags may come before, between or after the senders.
	for rest := args[2:]; ; rest = fs.Args()[1:] {
		if err := fs.Parse(rest); err != nil {
			return &exitError{2, err}
		}
		if fs.NArg() == 0 {
			break
		}
		allowed = append(allowed, fs.Arg(0))
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	password := strings.TrimRight(line, "\r\n")
	if password == "" {
		return &exitError{2, errors.New("no password on standard input")}
	}
	if *senders != "" {
		allowed = append(allowed, strings.Split(*senders, ",")...)
	}
	out, err := smtpd.UserLine(name, password, allowed)
	if err != nil {
		return &exitError{2, err}
	}
	fmt.Fprintln(stdout, out)
	return nil
}

// tokenCmd is `greyrelay token add -file FILE NAME [SENDER...]`: it makes a
// sending-API token, appends its hashed line to FILE (api.tokens_file,
// created with mode 0600) and prints the token, the only time it is shown.
func tokenCmd(args []string, stdout io.Writer) error {
	const use = "usage: greyrelay token add -file TOKENS_FILE NAME [SENDER...]"
	if len(args) < 1 || args[0] != "add" {
		return &exitError{2, errors.New(use)}
	}
	fs := flag.NewFlagSet("token add", flag.ContinueOnError)
	file := fs.String("file", "", "the tokens file to append to (api.tokens_file)")
	if err := fs.Parse(args[1:]); err != nil {
		return &exitError{2, err}
	}
	if *file == "" || fs.NArg() < 1 {
		return &exitError{2, errors.New(use)}
	}
	token, line, err := smtpd.NewToken(fs.Arg(0), fs.Args()[1:])
	if err != nil {
		return &exitError{2, err}
	}
	if err := appendLine(*file, line, fs.Arg(0)); err != nil {
		return err
	}
	fmt.Fprintln(stdout, token)
	return nil
}

// appendLine adds line to the tokens file, refusing a name already there
// (the file would no longer load).
func appendLine(path, line, name string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	old, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	if _, err := smtpd.ParseTokens(bytes.NewReader(append(old, "\n"+line+"\n"...))); err != nil {
		return &exitError{2, fmt.Errorf("%s: %w", path, err)}
	}
	if len(old) > 0 && old[len(old)-1] != '\n' {
		line = "\n" + line
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		return err
	}
	return f.Sync()
}
