package admincli

import (
	"context"
	"fmt"
	"io"

	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
)

// RunTLSReport runs `greyrelay tls-report send`.
func RunTLSReport(args []string, c *adminclient.Client, stdout io.Writer) error {
	if len(args) != 1 || args[0] != "send" {
		return fmt.Errorf("usage: greyrelay tls-report send [-config FILE]")
	}
	res, err := c.TLSReportSend(context.Background())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", res)
	return err
}
