package template

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// A host that reaches package indexes only through its own mirror or
// proxy says so in its pip and apt configuration; a build's commands run
// in a chroot with an environment of their own (chrootEnv), so what they
// need of that configuration is carried in: pip's index settings as its
// PIP_* variables, apt's proxies as -o options. Neither stays in the
// template.

// pipIndexKeys are the pip settings that say where packages come from,
// with the variables pip reads them from.
var pipIndexKeys = []struct{ key, env string }{
	{"index-url", "PIP_INDEX_URL"},
	{"extra-index-url", "PIP_EXTRA_INDEX_URL"},
	{"trusted-host", "PIP_TRUSTED_HOST"},
}

// hostPipEnv returns PIP_* variables for the host's pip index settings:
// its configuration files (site-wide, then the user's, then
// $PIP_CONFIG_FILE; later ones win, [install] over [global], as in pip),
// then the host's own PIP_* variables over them. Only http(s) indexes are
// carried: a local path on the host is not in the chroot.
func hostPipEnv(etc, home string, getenv func(string) string) []string {
	files := []string{filepath.Join(etc, "pip.conf"), filepath.Join(etc, "xdg/pip/pip.conf")}
	if home != "" {
		files = append(files, filepath.Join(home, ".pip/pip.conf"), filepath.Join(home, ".config/pip/pip.conf"))
	}
	if f := getenv("PIP_CONFIG_FILE"); f != "" {
		files = append(files, f)
	}
	got := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for k, v := range pipIndexSettings(string(b)) {
			got[k] = v
		}
	}
	var env []string
	for _, k := range pipIndexKeys {
		v := got[k.key]
		if e := getenv(k.env); e != "" {
			v = e
		}
		if v = webOnly(k.key, v); v != "" {
			env = append(env, k.env+"="+v)
		}
	}
	return env
}

// pipIndexSettings reads the index settings of one pip configuration file
// (INI: [global], then [install] over it; a value may go on over indented
// lines, as extra-index-url's list often does).
func pipIndexSettings(ini string) map[string]string {
	sections := map[string]map[string]string{}
	var section, key string
	sc := bufio.NewScanner(strings.NewReader(ini))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, ";"):
			continue
		case strings.HasPrefix(trimmed, "[") && strings.HasSuffix(trimmed, "]"):
			section, key = strings.ToLower(strings.TrimSpace(trimmed[1:len(trimmed)-1])), ""
			continue
		case line[0] == ' ' || line[0] == '\t':
			if key != "" && sections[section] != nil {
				sections[section][key] = strings.TrimSpace(sections[section][key] + " " + trimmed)
			}
			continue
		}
		k, v, ok := strings.Cut(trimmed, "=")
		if !ok {
			k, v, ok = strings.Cut(trimmed, ":")
		}
		if !ok {
			key = ""
			continue
		}
		key = strings.ReplaceAll(strings.ToLower(strings.TrimSpace(k)), "_", "-")
		if sections[section] == nil {
			sections[section] = map[string]string{}
		}
		sections[section][key] = strings.TrimSpace(v)
	}
	out := map[string]string{}
	for _, s := range []string{"global", "install"} {
		for _, k := range pipIndexKeys {
			if v, ok := sections[s][k.key]; ok {
				out[k.key] = v
			}
		}
	}
	return out
}

// webOnly keeps the http(s) URLs of an index setting (all of
// trusted-host, which names hosts), space-separated.
func webOnly(key, v string) string {
	fields := strings.Fields(v)
	if key != "trusted-host" {
		fields = slices.DeleteFunc(fields, func(f string) bool {
			return !strings.HasPrefix(f, "http://") && !strings.HasPrefix(f, "https://")
		})
	}
	return strings.Join(fields, " ")
}

// aptProxyRE finds apt's proxy settings in the one-line form
// (Acquire::http::Proxy "http://proxy:3128";), the form apt's own docs
// and most hosts use.
var aptProxyRE = regexp.MustCompile(`(?im)^\s*Acquire::(https?)::Proxy\s+"([^"]*)"\s*;`)

// hostAptProxyOpts returns apt-get -o options for the host's apt proxies
// (/etc/apt/apt.conf, then apt.conf.d in name order; later ones win).
func hostAptProxyOpts(etc string) []string {
	files := []string{filepath.Join(etc, "apt/apt.conf")}
	more, _ := filepath.Glob(filepath.Join(etc, "apt/apt.conf.d/*"))
	slices.Sort(more)
	files = append(files, more...)
	got := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, m := range aptProxyRE.FindAllStringSubmatch(string(b), -1) {
			got[strings.ToLower(m[1])] = m[2]
		}
	}
	var opts []string
	for _, scheme := range []string{"http", "https"} {
		if v, ok := got[scheme]; ok {
			opts = append(opts, "-o", "Acquire::"+scheme+"::Proxy="+v)
		}
	}
	return opts
}
