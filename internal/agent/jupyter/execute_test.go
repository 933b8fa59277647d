package jupyter

import (
	"slices"
	"testing"
)

func TestCollapseRepeats(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{nil, nil},
		{[]string{"a", "b", "c"}, []string{"a", "b", "c"}},
		{[]string{"a", "f", "f"}, []string{"a", "f", "f"}}, // twice is kept
		{[]string{"a", "f", "f", "f", "f", "z"}, []string{"a", "f", "[... the frame above repeated 3 more times ...]", "z"}},
		{[]string{"f", "g", "f", "g", "f", "g", "f"}, []string{"f", "g", "[... the 2 frames above repeated 2 more times ...]", "f"}},
	} {
		if got := collapseRepeats(c.in); !slices.Equal(got, c.want) {
			t.Errorf("collapseRepeats(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
