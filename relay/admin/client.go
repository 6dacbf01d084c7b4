package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

// Client talks to the admin API of a running relay. The CLI commands use
// it because the daemon holds the queue file's lock.
type Client struct {
	Base  string       // e.g. "http://127.0.0.1:8025"; "" when the admin server is disabled
	Token string       // bearer token; "" for none
	HTTP  *http.Client // nil: a client with a 60 s timeout
}

// clientTimeout bounds one CLI request; healthTimeout bounds `greyrelay
// health`, which container runtimes call often and expect to be quick.
const (
	clientTimeout = 60 * time.Second
	healthTimeout = 3 * time.Second
	maxResponse   = 256 << 20
)

// NewClient returns a client for the admin server that c configures. An
// unspecified listen address (0.0.0.0, [::]) is reached on loopback.
func NewClient(c *config.Config) *Client {
	cl := &Client{Token: c.Admin.Token, HTTP: &http.Client{Timeout: clientTimeout}}
	host, port, err := net.SplitHostPort(c.Admin.Address)
	if c.Admin.Address == "" || err != nil {
		return cl
	}
	if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if err == nil && ip.Is6() {
			host = "::1"
		}
	}
	cl.Base = "http://" + net.JoinHostPort(host, port)
	return cl
}

// apiError is an error answer of the admin API.
type apiError struct {
	Code int
	Msg  string
}

func (e *apiError) Error() string {
	if e.Code == http.StatusUnauthorized {
		return fmt.Sprintf("%s (HTTP 401): set admin.token or admin.token_file to the relay's token", e.Msg)
	}
	return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Code)
}

// call performs one request and returns the body of a 2xx answer. Any
// other answer becomes an *apiError carrying the server's message.
func (c *Client) call(ctx context.Context, method, path string, q url.Values) ([]byte, error) {
	if c.Base == "" {
		return nil, errors.New("the admin server is disabled (admin.address is empty), and the queue commands need it")
	}
	u := strings.TrimRight(c.Base, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, fmt.Errorf("admin request: %w", err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: clientTimeout}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("greyrelay is not reachable at %s: %w", c.Base, unwrapURL(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, fmt.Errorf("reading the answer from %s: %w", c.Base, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, &apiError{Code: resp.StatusCode, Msg: errorMessage(body)}
	}
	return body, nil
}

// unwrapURL drops *url.Error's "Get \"http://…\":" prefix: the message
// already names the address.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// errorMessage extracts {"error": …} or, failing that, the text body.
func errorMessage(body []byte) string {
	var e errorJSON
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	if s := cell(strings.TrimSpace(string(body)), 200); s != "-" {
		return s
	}
	return "no message"
}

// getJSON fetches path and decodes it into out; it returns the raw body
// too, which -json prints as received.
func (c *Client) getJSON(method, path string, q url.Values, out any) ([]byte, error) {
	body, err := c.call(context.Background(), method, path, q)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return nil, fmt.Errorf("unexpected answer from %s%s: %w", c.Base, path, err)
	}
	return body, nil
}
