package backoff_test

import (
	"testing"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/relay/config"
)

// TestDefaultPolicyIsDefaultYAML ties the policy the backoff tests start
// from to the defaults greyrelay really runs with (configs/default.yaml).
func TestDefaultPolicyIsDefaultYAML(t *testing.T) {
	c, err := config.Load(config.Source{Default: configs.Default})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Retry.Policy(), backoff.DefaultPolicy(); got != want {
		t.Errorf("configs/default.yaml retry = %+v\nbackoff.DefaultPolicy() = %+v", got, want)
	}
}
