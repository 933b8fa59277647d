// Package templates holds the built-in template specs (*.yaml), embedded in
// the binary. Only internal/template reads them.
package templates

import "embed"

// FS holds every *.yaml in this directory.
//
//go:embed *.yaml
var FS embed.FS
