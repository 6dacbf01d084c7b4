// Package admincli is greyrelay's operator commands (`greyrelay queue`,
// `destinations`, `health`, `tls-report send`): thin clients of the admin
// HTTP API (relay/admin), which is the one place that reads and changes
// the queue on an operator's behalf; the CLI never opens the queue file,
// which the running daemon holds locked.
//
// The CLI commands print aligned tables by default and the API's JSON with
// -json. Relative times ("in 4m", "12m ago") use the server's clock from
// the answer, so they are right even if the two clocks disagree. Every
// value that came from a remote server is passed through admin.Cell, which
// removes control characters before they reach the terminal.
package admincli
