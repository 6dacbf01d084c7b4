package admin

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greyrelay/greyrelay/relay/metrics"
)

// The Grafana dashboard in configs/ must only chart metrics the relay
// exports: a renamed metric would otherwise leave an empty panel that
// nobody notices until an incident.
func TestGrafanaDashboardUsesExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("../../configs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics.New(reg)
	newFixture(t, func(o *Options) { o.Registry = reg })
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
	}
	names := regexp.MustCompile(`greyrelay_[a-z_]+`).FindAllString(string(b), -1)
	if len(names) == 0 {
		t.Fatal("dashboard charts no greyrelay metric")
	}
	for _, n := range names {
		base := strings.TrimSuffix(n, "_bucket")
		if !exported[base] && !registeredByMetrics(t, base) {
			t.Errorf("dashboard uses %s, which the relay does not export", n)
		}
	}
}

func registeredByMetrics(t *testing.T, name string) bool {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg)
	// Vectors without a child are not gathered: touch each once.
	m.Rejected.WithLabelValues("5", "x").Inc()
	m.TLSIn.WithLabelValues("yes").Inc()
	m.TLSOut.WithLabelValues("yes").Inc()
	m.Deliveries.WithLabelValues("delivered", "x").Inc()
	m.DSNs.WithLabelValues("failed").Inc()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return true
		}
	}
	return false
}
