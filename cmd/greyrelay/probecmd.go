package main

import (
	"context"
	"errors"
	"io"

	"github.com/greyrelay/greyrelay/relay/config"
)

// probeFunc is handed to the admin server so the status page can probe.
func probeFunc(cfg *config.Config) func(ctx context.Context, target string) (any, error) {
	return nil
}

func probeCmd(args []string, stdout, stderr io.Writer) error {
	return &exitError{2, errors.New("probe: not implemented yet")}
}
