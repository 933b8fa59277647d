package template

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Mirrors are the Debian archive and its security archive that template
// builds use. They come from the host's own apt configuration (or the
// operator's --mirror), so no archive host is named in the code.
type Mirrors struct {
	Debian   string // e.g. what the host's sources name for its release suite
	Security string // the archive of <suite>-security; "" when the host has none
}

// aptSourcesFiles are where apt reads its sources, in apt's order.
func aptSourcesFiles(etc string) []string {
	files := []string{filepath.Join(etc, "apt/sources.list")}
	for _, pat := range []string{"apt/sources.list.d/*.list", "apt/sources.list.d/*.sources"} {
		m, _ := filepath.Glob(filepath.Join(etc, pat))
		files = append(files, m...)
	}
	return files
}

// HostMirrors reads the host's apt sources (/etc/apt/sources.list and
// sources.list.d, one-line and deb822 formats).
func HostMirrors() (Mirrors, error) { return mirrorsFrom("/etc") }

func mirrorsFrom(etc string) (Mirrors, error) {
	var all []aptSource
	for _, f := range aptSourcesFiles(etc) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".sources") {
			all = append(all, parseDeb822(string(b))...)
		} else {
			all = append(all, parseOneLine(string(b))...)
		}
	}
	m := pickMirrors(all)
	if m.Debian == "" {
		return m, errors.New("the host's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d) name no http(s) Debian archive: pass --mirror (or PANDASTACK_DEBIAN_MIRROR), or give the spec a mirror")
	}
	return m, nil
}

// aptSource is one (archive, suite) pair of a "deb" source.
type aptSource struct{ uri, suite string }

func parseOneLine(s string) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // [ options ], maybe spread over fields
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 {
			out = append(out, aptSource{f[0], f[1]})
		}
	}
	return out
}

func parseDeb822(s string) []aptSource {
	var out []aptSource
	flush := func(st map[string]string) {
		if !slices.Contains(strings.Fields(st["types"]), "deb") || strings.EqualFold(st["enabled"], "no") {
			return
		}
		for _, u := range strings.Fields(st["uris"]) {
			for _, suite := range strings.Fields(st["suites"]) {
				out = append(out, aptSource{u, suite})
			}
		}
	}
	st := map[string]string{}
	key := ""
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimRight(line, " \t\r")
		switch {
		case strings.HasPrefix(line, "#"):
		case line == "":
			flush(st)
			st, key = map[string]string{}, ""
		case line[0] == ' ' || line[0] == '\t': // continuation
			if key != "" {
				st[key] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if ok {
				key = strings.ToLower(strings.TrimSpace(k))
				st[key] = strings.TrimSpace(v)
			}
		}
	}
	flush(st)
	return out
}

// pickMirrors takes the first http(s) archive of a release suite (no "-"
// in its name) as the Debian archive, and the first archive of a
// "-security" suite as the security archive. Archives whose path names
// Debian are preferred, so a host that also lists a vendor's repository
// does not build templates from it.
func pickMirrors(srcs []aptSource) Mirrors {
	var m Mirrors
	for _, debianOnly := range []bool{true, false} {
		for _, s := range srcs {
			if !strings.HasPrefix(s.uri, "http://") && !strings.HasPrefix(s.uri, "https://") {
				continue
			}
			if debianOnly && !strings.Contains(strings.ToLower(s.uri), "debian") {
				continue
			}
			uri := strings.TrimRight(s.uri, "/")
			switch {
			case strings.HasSuffix(s.suite, "-security") || strings.HasSuffix(s.suite, "/updates"):
				if m.Security == "" {
					m.Security = uri
				}
			case !strings.Contains(s.suite, "-") && !strings.Contains(uri, "security"):
				if m.Debian == "" {
					m.Debian = uri
				}
			}
		}
	}
	return m
}
