package main

import (
	"flag"
	"io"
	"slices"

	"github.com/greyrelay/greyrelay/relay/admin"
)

// clientFor reads -config (if given before the subcommand's own flags) and
// returns an admin API client for the running relay. The queue file itself
// is locked by the daemon, so operator commands always go through the API.
func clientFor(args []string, stderr io.Writer) (*admin.Client, []string, error) {
	fs := flag.NewFlagSet("greyrelay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration file of the running relay")
	// Only a leading -config is ours; everything else belongs to the subcommand.
	if len(args) >= 2 && (args[0] == "-config" || args[0] == "--config") {
		if err := fs.Parse(args[:2]); err != nil {
			return nil, nil, &exitError{2, err}
		}
		args = args[2:]
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return nil, nil, err
	}
	return admin.NewClient(cfg), args, nil
}

func queueCmd(args []string, stdout, stderr io.Writer) error {
	c, rest, err := clientFor(args, stderr)
	if err != nil {
		return err
	}
	if len(rest) > 0 && rest[0] == "list" && slices.Contains(rest, "-cluster") {
		return queueListCluster(args, slices.DeleteFunc(rest, func(a string) bool { return a == "-cluster" }), c, stdout, stderr)
	}
	return admin.RunQueue(rest, c, stdout, stderr)
}

func destinationsCmd(args []string, stdout, stderr io.Writer) error {
	c, rest, err := clientFor(args, stderr)
	if err != nil {
		return err
	}
	return admin.RunDestinations(rest, c, stdout, stderr)
}

func healthCmd(args []string, stdout, stderr io.Writer) error {
	c, _, err := clientFor(args, stderr)
	if err != nil {
		return err
	}
	return admin.RunHealth(c, stdout)
}
