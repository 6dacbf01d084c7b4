package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/smtpd"
)

// loadConfig is the one way every subcommand reads its configuration:
// the embedded default, the file if any, then the environment. With no
// -config flag, GREYRELAY_CONFIG names the file (the container's way).
func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		path = os.Getenv(config.EnvConfigFile)
	}
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
		return &exitError{2, errors.New("usage: greyrelay config check -config FILE | config default")}
	}
	switch args[0] {
	case "default":
		_, err := stdout.Write(configs.Default)
		return err
	case "check":
		fs := flag.NewFlagSet("config check", flag.ContinueOnError)
		fs.SetOutput(stderr)
		path := fs.String("config", "", "configuration file to check")
		if err := fs.Parse(args[1:]); err != nil {
			return &exitError{2, err}
		}
		if *path == "" && fs.NArg() == 1 {
			*path = fs.Arg(0)
		}
		c, err := loadConfig(*path)
		if err != nil {
			return err
		}
		for _, w := range c.Warnings() {
			fmt.Fprintln(stderr, "warning:", w)
		}
		fmt.Fprintf(stdout, "%s: configuration is valid\n", displayName(*path))
		return nil
	}
	return &exitError{2, fmt.Errorf("unknown config subcommand %q", args[0])}
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
