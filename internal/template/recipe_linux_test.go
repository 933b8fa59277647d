package template

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// recipeDigests are the digests of the build recipe (recipeDigest) by
// BuilderVersion. Every spec's hash includes BuilderVersion, not the
// recipe: a recipe changed without a bump leaves the builds of the old one
// counted as built (version 3's /tmp marker came 14 minutes after its bump,
// and builds made in between kept a /tmp in memory). When
// TestRecipeIsVersioned fails, bump BuilderVersion in spec.go and add its
// digest here.
var recipeDigests = map[string]string{
	"3": "1dfddf7bf66ea4382abd0130dc3358aba9bc046d7dc9a8d055eb91f801259978",
}

// recipeDigest is a digest of what the builder does to every root
// filesystem after the debootstrap stage: its scripts and settings, and
// the names and order of its steps for a spec that uses every field (not
// the code inside a step, nor the stage's own debootstrap command).
func recipeDigest() string {
	h := sha256.New()
	for _, part := range []string{noDocs, writeFileScript, createUserScript, cleanupScript, chrootProc, buildCA,
		strings.Join(chrootEnv, "\n"), strings.Join(aptOpts, " ")} {
		fmt.Fprintf(h, "%d\n%s\n", len(part), part)
	}
	b := &builder{spec: Spec{Name: "all", Suite: "bookworm", Apt: []string{"curl"}, Pip: []string{"numpy"},
		Files: []File{{Path: "/etc/x", Content: "x"}}, Run: []string{"true"}}}
	for _, s := range b.chrootSteps() {
		fmt.Fprintf(h, "step %s\n", s.title)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// The build recipe is tied to BuilderVersion (see recipeDigests).
func TestRecipeIsVersioned(t *testing.T) {
	if got, want := recipeDigest(), recipeDigests[BuilderVersion]; got != want {
		t.Fatalf("the build recipe's digest is %s, recorded for BuilderVersion %s: %q. If the recipe changed, bump BuilderVersion in spec.go (so that every template is built again) and record the new digest in recipeDigests", got, BuilderVersion, want)
	}
}
