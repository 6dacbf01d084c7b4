package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/greyrelay/greyrelay/queue/salvage"
	"github.com/greyrelay/greyrelay/relay/admin/admincli"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
)

// clientFor reads -config (if given before the subcommand's own flags) and
// returns an admin API client for the running relay. The queue file itself
// is locked by the daemon, so operator commands always go through the API.
func clientFor(args []string, stderr io.Writer) (*adminclient.Client, []string, error) {
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
	cfg, _, err := loadConfig(*path, stderr)
	if err != nil {
		return nil, nil, err
	}
	return adminclient.New(cfg), args, nil
}

func queueCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "salvage" {
		return salvageCmd(args[1:], stdout, stderr)
	}
	c, rest, err := clientFor(args, stderr)
	if err != nil {
		return err
	}
	if len(rest) > 0 && (rest[0] == "list" || rest[0] == "show") && slices.Contains(rest, "-cluster") {
		rest = slices.DeleteFunc(rest, func(a string) bool { return a == "-cluster" })
		if rest[0] == "show" {
			return queueShowCluster(args, rest, c, stdout, stderr)
		}
		return queueListCluster(args, rest, c, stdout, stderr)
	}
	return admincli.RunQueue(rest, c, stdout, stderr)
}

func destinationsCmd(args []string, stdout, stderr io.Writer) error {
	c, rest, err := clientFor(args, stderr)
	if err != nil {
		return err
	}
	return admincli.RunDestinations(rest, c, stdout, stderr)
}

func healthCmd(args []string, stdout, stderr io.Writer) error {
	c, _, err := clientFor(args, stderr)
	if err != nil {
		return err
	}
	return admincli.RunHealth(c, stdout)
}

// salvageCmd copies what can be read of a damaged queue file into a fresh
// one (queue/salvage), offline: it refuses a file a running relay holds.
func salvageCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("queue salvage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration file of the stopped relay")
	if err := fs.Parse(args); err != nil {
		return &exitError{2, err}
	}
	cfg, _, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &exitError{2, fmt.Errorf("queue salvage takes no arguments, only -config FILE")}
	}
	rep, err := salvage.Salvage(cfg.Queue.Path, time.Now())
	if rep != nil {
		printSalvage(stdout, cfg.Queue.Path, rep)
	}
	return err
}

func printSalvage(w io.Writer, path string, rep *salvage.Report) {
	fmt.Fprintf(w, "damaged file kept as %s\n", rep.DamagedPath)
	for _, d := range rep.Damage {
		fmt.Fprintf(w, "unreadable: %s\n", d)
	}
	for _, l := range rep.Lost {
		fmt.Fprintf(w, "not recovered: %s\n", l)
	}
	fmt.Fprintf(w, "recovered %d messages (%d recipients to deliver) into %s; %d not recovered\n",
		rep.Messages, rep.Recipients, path, len(rep.Lost))
}
