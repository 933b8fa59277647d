package agentproto

import (
	"strings"

	"github.com/pandastack/pandastack"
)

// The checks below are the one validation path for each kind of input that
// both the host (before it bothers the agent) and the agent (which must not
// trust the host's checks) apply. Each returns an EInvalid *pandastack.Error.

// Limits on paths, as Linux has them (PATH_MAX, NAME_MAX).
const (
	MaxPathLen = 4096
	MaxNameLen = 255
)

// CheckPath validates a file path given by a client: non-empty, no NUL, at
// most MaxPathLen bytes and no component longer than MaxNameLen.
func CheckPath(p string) error {
	switch {
	case p == "":
		return pandastack.Errorf(pandastack.EInvalid, "the path is empty; give a path, absolute or relative to %s", UserHome)
	case len(p) > MaxPathLen:
		return pandastack.Errorf(pandastack.EInvalid, "the path is %d bytes long; at most %d are allowed", len(p), MaxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return pandastack.Errorf(pandastack.EInvalid, "the path holds a NUL byte")
	}
	for _, c := range strings.Split(p, "/") {
		if len(c) > MaxNameLen {
			return pandastack.Errorf(pandastack.EInvalid, "a path component is %d bytes long (%.40q…); at most %d are allowed", len(c), c, MaxNameLen)
		}
	}
	return nil
}

// Limits on environment variables.
const (
	MaxEnvVars     = 256
	MaxEnvValueLen = 32 << 10
	// MaxEnvTotal bounds the names and values together: the kernel passes
	// a process at most 2 MiB of arguments and environment, and a larger
	// environment made a sandbox boot only to fail its setup.
	MaxEnvTotal = 1 << 20
)

// CheckEnv validates environment variables: at most MaxEnvVars, names of
// letters, digits and '_' not starting with a digit, values without NUL and
// at most MaxEnvValueLen bytes, all of it at most MaxEnvTotal.
func CheckEnv(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return pandastack.Errorf(pandastack.EInvalid, "env: at most %d variables, got %d", MaxEnvVars, len(env))
	}
	total := 0
	for k, v := range env {
		total += len(k) + len(v) + 2 // "=" and the NUL after each
	}
	if total > MaxEnvTotal {
		return pandastack.Errorf(pandastack.EInvalid, "env: %d bytes in all, over the limit of %d; pass large values in a file (PUT /v1/sandboxes/{id}/files)", total, MaxEnvTotal)
	}
	for k, v := range env {
		if !validEnvName(k) {
			return pandastack.Errorf(pandastack.EInvalid, "env: %q is not a valid variable name (letters, digits and _, not starting with a digit)", k)
		}
		if len(v) > MaxEnvValueLen {
			return pandastack.Errorf(pandastack.EInvalid, "env %s: value longer than %d bytes", k, MaxEnvValueLen)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return pandastack.Errorf(pandastack.EInvalid, "env %s: the value holds a NUL byte, which no environment can carry", k)
		}
	}
	return nil
}

func validEnvName(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// ParseBool reads a boolean query parameter strictly: absent or empty is
// def; "1"/"true" and "0"/"false" are the only values.
func ParseBool(name, v string, def bool) (bool, error) {
	switch v {
	case "":
		return def, nil
	case "1", "true":
		return true, nil
	case "0", "false":
		return false, nil
	}
	return false, pandastack.Errorf(pandastack.EInvalid, "%s=%.40q: give true or false (or 1 or 0)", name, v)
}

// File operations run as the sandbox user unless the client asks for root,
// like exec. These are the values of the user query parameter.
const (
	FileUserDefault = "user"
	FileUserRoot    = "root"
)

// CheckFileUser validates the user query parameter of a file operation and
// reports whether it asks for root.
func CheckFileUser(v string) (root bool, err error) {
	switch v {
	case "", FileUserDefault:
		return false, nil
	case FileUserRoot:
		return true, nil
	}
	return false, pandastack.Errorf(pandastack.EInvalid, "user=%.40q: give %q (the default) or %q", v, FileUserDefault, FileUserRoot)
}

// CheckQuery refuses query parameters other than the allowed ones, so a
// misspelt option is an error rather than silently ignored.
func CheckQuery(q map[string][]string, allowed ...string) error {
	for k, vs := range q {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok {
			return pandastack.Errorf(pandastack.EInvalid, "unknown query parameter %.40q; this route takes %s", k, strings.Join(allowed, ", "))
		}
		if len(vs) > 1 {
			return pandastack.Errorf(pandastack.EInvalid, "query parameter %q given %d times; give it once", k, len(vs))
		}
	}
	return nil
}

// ProtectedPrefix is where the host mounts what the sandbox needs of it (the
// agent binary); no file operation may write or delete there.
const ProtectedPrefix = "/.pandastack"

// PseudoFS are the kernel's pseudo-filesystems inside a sandbox. Their files
// are not data: reading may block or fail midway, and links lead back to /.
var PseudoFS = []string{"/proc", "/sys", "/dev"}

// Under reports whether the clean absolute path p is dir or beneath it.
func Under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}
