package metrics

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func TestTextFormat(t *testing.T) {
	r := New()
	c := r.NewCounter("t_ops_total", "Operations.\nSecond line with a \\.", "op", "outcome")
	c.Inc("create", "ok")
	c.Add(2, "create", "ok")
	c.Inc("fork", "error")
	c.Add(-1, "fork", "error") // refused: counters only go up
	h := r.NewHistogram("t_seconds", "Durations.", []float64{0.1, 1}, "op")
	h.Observe(0.05, "create")
	h.Observe(0.1, "create") // on a bound: counted in it (le)
	h.Observe(3, "create")
	r.NewGauge("t_things", "Things.", []string{"state"}, func(emit func(float64, ...string)) {
		emit(2, "b")
		emit(1, `a"q\`+"\n")
	})
	r.NewGauge("t_plain", "No labels.", nil, func(emit func(float64, ...string)) { emit(0.5) })
	var b strings.Builder
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	want := `# HELP t_ops_total Operations.\nSecond line with a \\.
# TYPE t_ops_total counter
t_ops_total{op="create",outcome="ok"} 3
t_ops_total{op="fork",outcome="error"} 1
# HELP t_plain No labels.
# TYPE t_plain gauge
t_plain 0.5
# HELP t_seconds Durations.
# TYPE t_seconds histogram
t_seconds_bucket{op="create",le="0.1"} 2
t_seconds_bucket{op="create",le="1"} 2
t_seconds_bucket{op="create",le="+Inf"} 3
t_seconds_sum{op="create"} 3.15
t_seconds_count{op="create"} 3
# HELP t_things Things.
# TYPE t_things gauge
t_things{state="a\"q\\\n"} 1
t_things{state="b"} 2
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	if c.Value("create", "ok") != 3 || c.Value("kill", "ok") != 0 {
		t.Errorf("Value: %v %v", c.Value("create", "ok"), c.Value("kill", "ok"))
	}
	if h.Count("create") != 3 {
		t.Errorf("Count %d", h.Count("create"))
	}
}

func TestMisuse(t *testing.T) {
	r := New()
	c := r.NewCounter("t_total", "x", "a")
	for name, f := range map[string]func(){
		"label count":  func() { c.Inc("1", "2") },
		"twice":        func() { r.NewCounter("t_total", "x") },
		"bad name":     func() { r.NewCounter("t-dash", "x") },
		"digit first":  func() { r.NewCounter("1t", "x") },
		"bounds order": func() { r.NewHistogram("t_h", "x", []float64{2, 1}) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		})
	}
}

func TestHandlerAndProcess(t *testing.T) {
	r := New()
	RegisterProcess(r, "t", "v1.2")
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != ContentType {
		t.Errorf("content type %q", ct)
	}
	var b strings.Builder
	r.WriteTo(&b)
	text := b.String()
	if !strings.Contains(text, `t_build_info{version="v1.2",go_version="go`) {
		t.Errorf("no build info:\n%s", text)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total", "process_start_time_seconds"} {
		v, ok := sampleValue(text, name)
		if !ok || v < 0 || v == 0 && name != "process_cpu_seconds_total" { // a fresh test may not have used a tick
			t.Errorf("%s: %v %v", name, v, ok)
		}
	}
	post, err := http.Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", post.StatusCode)
	}
}

// sampleValue finds the sample line of a series without labels.
func sampleValue(text, name string) (float64, bool) {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}
