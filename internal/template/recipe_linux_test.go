package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
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
	"3": "88285aa7502ca29b4f8b015ae76927ab77294d83dd5c166a3bc67a505cd896f9",
}

// recipeDigest is a digest of what the builder runs in the chroot after
// the debootstrap stage, for a spec that uses every field: each step's
// title, and each command it runs with its arguments and input, the files
// it writes among them. What comes from the host is left out (its
// resolver file, its CA bundle, its apt proxies; its security archive is a
// placeholder), and so is the stage's own debootstrap command.
func recipeDigest(t *testing.T) string {
	h := sha256.New()
	b := &builder{
		spec: Spec{Name: "all", Suite: "bookworm", Apt: []string{"curl"}, Pip: []string{"numpy"},
			Files: []File{{Path: "/etc/x", Content: "x", Mode: 0o600}}, Run: []string{"true"}},
		security: "SECURITY-ARCHIVE",
		env:      chrootEnv,
		record: func(chroot bool, name string, args []string, stdin []byte) {
			if name == "/bin/sh" && len(args) > 3 && args[1] == writeFileScript && args[3] == "/etc/resolv.conf" {
				return // the host's, when it has one
			}
			fmt.Fprintf(h, "run chroot=%v %q %q %d:%s\n", chroot, name, args, len(stdin), stdin)
		},
	}
	fmt.Fprintf(h, "env %q\n", slices.Clone(b.env))
	for _, s := range b.chrootSteps() {
		fmt.Fprintf(h, "step %s\n", s.title)
		if err := s.run(context.Background(), "/nonexistent-root"); err != nil {
			t.Fatalf("step %s: %v", s.title, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// The build recipe is tied to BuilderVersion (see recipeDigests).
func TestRecipeIsVersioned(t *testing.T) {
	if got, want := recipeDigest(t), recipeDigests[BuilderVersion]; got != want {
		t.Fatalf("the build recipe's digest is %s, recorded for BuilderVersion %s: %q. If the recipe changed, bump BuilderVersion in spec.go (so that every template is built again) and record the new digest in recipeDigests", got, BuilderVersion, want)
	}
}
