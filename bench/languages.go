package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pandastack/pandastack/client"
)

// langCells are a cell per language of the code-interpreter template and
// what its output contains.
var langCells = []struct{ lang, code, want string }{
	{"python", "1 + 1", "2"},
	{"bash", "echo $((1 + 1))", "2"},
	{"javascript", "1 + 1", "2"},
	{"typescript", "const n: number = 1; n + 1", "2"},
	{"r", "cat(1 + 1)", "2"},
	{"java", "1 + 1", "2"},
}

// languages measures, per language, the first run_code in a fresh sandbox
// (its default context of that language starts then: a cold kernel, except
// Python's, which the warm image holds) and the run right after it (warm),
// each in a sandbox of its own on the pooled server.
func (b *bench) languages(ctx context.Context) error {
	s := b.pool
	for _, l := range langCells {
		var cold, warm []float64
		for range b.set.N {
			sb, err := s.create(ctx, ciTemplate)
			if err != nil {
				return err
			}
			run := func() (float64, error) {
				t0 := time.Now()
				ex, err := s.c.RunCode(ctx, sb.ID, client.RunRequest{Code: l.code, Language: l.lang, TimeoutSeconds: 300})
				d := ms(time.Since(t0))
				switch {
				case err != nil:
					return 0, fmt.Errorf("%s: %w", l.lang, err)
				case ex.Error != nil:
					return 0, fmt.Errorf("%s: %s: %s", l.lang, ex.Error.Name, ex.Error.Value)
				case !strings.Contains(ex.Text+ex.Stdout, l.want):
					return 0, fmt.Errorf("%s: %q printed %q, gave %q; want %q", l.lang, l.code, ex.Stdout, ex.Text, l.want)
				}
				return d, nil
			}
			c, err := run()
			if err == nil {
				var w float64
				if w, err = run(); err == nil {
					cold, warm = append(cold, c), append(warm, w)
				}
			}
			s.kill(sb.ID)
			if err != nil {
				return err
			}
		}
		b.add(summarize("languages", l.lang+": first run_code (its context starts)", "ms", cold,
			"a fresh code-interpreter sandbox from the pool; the default context of the language starts on this run"))
		b.add(summarize("languages", l.lang+": second run_code (warm)", "ms", warm, "the same sandbox, right after"))
	}
	return nil
}
