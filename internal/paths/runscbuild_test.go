package paths

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// runscSources are the digests of scripts/runsc-precompiled's sources
// (runscDigest) that each RunscBuild was made from. The cached runsc is
// keyed by RunscBuild: a change to what the script patches without a new
// RunscBuild left machines on the runsc built before it (twice, for hours).
// When TestRunscBuildKeysItsSources fails: if the change alters what runsc
// does, change RunscBuild and record the new digest under it; if it does
// not (a comment, a test), add the digest to the current build's list.
var runscSources = map[string][]string{
	"precompiled-18": {"8267fdddf641c89fee9c6644a24a1b064e17c40d4dc6d55c4fe6dbbdce33158d"},
}

// runscDigest is a digest of the runsc build's generator: its Go sources
// (not its tests), go.mod and go.sum.
func runscDigest(t *testing.T) string {
	dir := filepath.Join("..", "..", "scripts", "runsc-precompiled")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if (strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go")) || n == "go.mod" || n == "go.sum" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestRunscBuildKeysItsSources(t *testing.T) {
	if got := runscDigest(t); !slices.Contains(runscSources[RunscBuild], got) {
		t.Fatalf("scripts/runsc-precompiled's sources digest to %s, not recorded for RunscBuild %q (%v). If the change alters what runsc does, change RunscBuild (machines then build runsc again) and record the digest under it; if not, add it to %q's list", got, RunscBuild, runscSources[RunscBuild], RunscBuild)
	}
}
