package classifier

import (
	"strings"

	"github.com/greyrelay/greyrelay/internal/safetext"
)

// maxText bounds Verdict.Text: enough for any real reply, small enough for
// a log line, a queue record and a DSN's Diagnostic-Code.
const maxText = 512

// sanitize makes outside text one safe line (safetext.Line) of at most
// maxText bytes.
func sanitize(s string) string {
	return strings.TrimSpace(safetext.Cut(safetext.Line(s), maxText))
}
