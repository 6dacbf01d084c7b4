// Package configs holds greyrelay's configuration data files. The one that
// matters at run time, default.yaml, is embedded here so that the binary's
// defaults and their documentation are the same bytes: a key cannot have a
// default without a comment next to it, and `greyrelay config default`
// prints exactly what the relay runs with when no file is given.
package configs

import _ "embed"

// Default is the complete default configuration with a comment on every key.
//
//go:embed default.yaml
var Default []byte
