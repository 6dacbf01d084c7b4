package logrepeat

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestWrap(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	type line struct {
		level zapcore.Level
		msg   string
		at    time.Duration
	}
	tests := []struct {
		name  string
		lines []line
		want  []string // messages written, with ":N" for a repeated count
	}{
		{"distinct messages all pass", []line{{zapcore.ErrorLevel, "a", 0}, {zapcore.ErrorLevel, "b", 0}, {zapcore.WarnLevel, "a", 0}},
			[]string{"a", "b", "a"}},
		{"repeats within the interval are dropped and counted", []line{
			{zapcore.ErrorLevel, "a", 0}, {zapcore.ErrorLevel, "a", time.Second}, {zapcore.ErrorLevel, "a", 30 * time.Second},
			{zapcore.ErrorLevel, "a", time.Minute}, {zapcore.ErrorLevel, "a", 61 * time.Second}},
			[]string{"a", "a:2"}},
		{"info lines are never dropped", []line{{zapcore.InfoLevel, "i", 0}, {zapcore.InfoLevel, "i", 0}},
			[]string{"i", "i"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs, logs := observer.New(zapcore.InfoLevel)
			log := zap.New(Wrap(obs, time.Minute)).With(zap.String("k", "v"))
			for _, l := range tt.lines {
				if ce := log.Check(l.level, l.msg); ce != nil {
					ce.Time = t0.Add(l.at)
					ce.Write()
				}
			}
			var got []string
			for _, e := range logs.All() {
				s := e.Message
				if n, ok := e.ContextMap()["repeated"]; ok {
					s += ":" + fmtInt(n)
				}
				got = append(got, s)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("got %q, want %q", got, tt.want)
				}
			}
		})
	}
}

func fmtInt(v any) string {
	n, _ := v.(int64)
	return string(rune('0' + n))
}
