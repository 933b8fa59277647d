package pandastack

import "testing"

func TestHistoryShare(t *testing.T) {
	for _, c := range []struct {
		held []int64
		max  int64
		want int64
	}{
		{nil, 100, -1},
		{[]int64{30, 40}, 100, -1},           // fits
		{[]int64{10, 500}, 100, 90},          // the small one keeps all, the flood the rest
		{[]int64{60, 60}, 100, 50},           // equal: equal shares
		{[]int64{10, 20, 300, 400}, 130, 50}, // 10 + 20 kept, 100 left for two
		{[]int64{10, 20, 300, 400}, 29, 7},   // even the small ones are cut
		{[]int64{5, 1000}, 0, 0},             // nothing may stay
		{[]int64{100, 100, 100}, 299, 99},    // rounded down, so the sum fits
	} {
		got := HistoryShare(c.held, c.max)
		if got != c.want {
			t.Errorf("HistoryShare(%v, %d) = %d, want %d", c.held, c.max, got, c.want)
		}
		if got >= 0 {
			var sum int64
			for _, h := range c.held {
				sum += min(h, got)
			}
			if sum > c.max {
				t.Errorf("HistoryShare(%v, %d) = %d keeps %d in all", c.held, c.max, got, sum)
			}
		}
	}
}
