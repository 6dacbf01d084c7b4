package adminclient

import (
	"context"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/relay/config"
)

func TestNew(t *testing.T) {
	tests := []struct{ addr, base string }{
		{"127.0.0.1:8025", "http://127.0.0.1:8025"},
		{"[::1]:8025", "http://[::1]:8025"},
		{"localhost:9000", "http://localhost:9000"},
		{"0.0.0.0:9000", "http://127.0.0.1:9000"},
		{"[::]:9000", "http://[::1]:9000"},
		{":9000", "http://127.0.0.1:9000"},
		{"", ""},
	}
	for _, tt := range tests {
		c := New(&config.Config{Admin: config.Admin{Address: tt.addr, Token: "t"}})
		if c.Base != tt.base || c.Token != "t" || c.HTTP == nil || c.HTTP.Timeout == 0 {
			t.Errorf("%q: %+v, want base %q", tt.addr, c, tt.base)
		}
	}
	c := New(&config.Config{})
	if _, err := c.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "disabled") {
		t.Errorf("disabled admin: %v", err)
	}
}
