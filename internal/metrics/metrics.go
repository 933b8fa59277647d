// Package metrics keeps the server's counters and histograms and writes them,
// with gauges read at scrape time, in Prometheus' text exposition format
// (version 0.0.4), so an operator's Prometheus, or anything that reads that
// format, can watch a node. Stdlib only: the server needs a handful of series,
// not a client library.
//
// Anything may import it. Series are registered once, at start; recording is
// a map lookup under a mutex per family, cheap next to what it counts (an
// HTTP request, a sandbox's restore).
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Registry holds the families of one server. The zero value is not usable;
// call New.
type Registry struct {
	mu       sync.Mutex
	families map[string]family
}

// New returns an empty registry.
func New() *Registry { return &Registry{families: map[string]family{}} }

type family interface {
	write(w *bufio.Writer)
}

func (r *Registry) add(name string, f family) {
	if !validName(name) {
		panic("metrics: bad name " + name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.families[name]; dup {
		panic("metrics: " + name + " registered twice")
	}
	r.families[name] = f
}

// WriteTo writes every family, sorted by name, in the text format.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	names := make([]string, 0, len(r.families))
	for n := range r.families {
		names = append(names, n)
	}
	fams := make([]family, 0, len(names))
	slices.Sort(names)
	for _, n := range names {
		fams = append(fams, r.families[n])
	}
	r.mu.Unlock()
	cw := &countingWriter{w: w}
	bw := bufio.NewWriter(cw)
	for _, f := range fams {
		f.write(bw)
	}
	err := bw.Flush()
	return cw.n, err
}

// ContentType is the text format's media type.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Handler serves the registry on GET (and HEAD).
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", ContentType)
		if req.Method == http.MethodHead {
			return
		}
		r.WriteTo(w)
	})
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Counter is a family of counters, one per combination of label values.
type Counter struct {
	name, help string
	labels     []string
	mu         sync.Mutex
	vals       map[string]*sample // by joined label values
}

type sample struct {
	labels []string
	v      float64
}

// NewCounter registers a counter family with the given label names.
func (r *Registry) NewCounter(name, help string, labels ...string) *Counter {
	c := &Counter{name: name, help: help, labels: labels, vals: map[string]*sample{}}
	r.add(name, c)
	return c
}

// Inc adds one to the counter of these label values.
func (c *Counter) Inc(values ...string) { c.Add(1, values...) }

// Add adds v (not negative) to the counter of these label values. The number
// of values must match the family's labels.
func (c *Counter) Add(v float64, values ...string) {
	if len(values) != len(c.labels) {
		panic(fmt.Sprintf("metrics: %s takes %d label values, got %d", c.name, len(c.labels), len(values)))
	}
	if !(v >= 0) || math.IsInf(v, 1) { // negative, NaN or infinite: a counter cannot take it
		return
	}
	k := strings.Join(values, "\xff")
	c.mu.Lock()
	s := c.vals[k]
	if s == nil {
		s = &sample{labels: slices.Clone(values)}
		c.vals[k] = s
	}
	s.v += v
	c.mu.Unlock()
}

// Value returns the counter of these label values (0 if never added to).
func (c *Counter) Value(values ...string) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.vals[strings.Join(values, "\xff")]; s != nil {
		return s.v
	}
	return 0
}

func (c *Counter) write(w *bufio.Writer) {
	header(w, c.name, c.help, "counter")
	c.mu.Lock()
	samples := sortedSamples(c.vals)
	c.mu.Unlock()
	for _, s := range samples {
		line(w, c.name, c.labels, s.labels, "", "", s.v)
	}
}

func sortedSamples(m map[string]*sample) []sample {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]sample, 0, len(keys))
	for _, k := range keys {
		out = append(out, *m[k])
	}
	return out
}

// Histogram is a family of histograms with fixed upper bounds.
type Histogram struct {
	name, help string
	labels     []string
	bounds     []float64
	mu         sync.Mutex
	vals       map[string]*hsample
}

type hsample struct {
	labels []string
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      uint64
}

// NewHistogram registers a histogram family; bounds are the buckets' upper
// bounds, ascending (+Inf is added).
func (r *Registry) NewHistogram(name, help string, bounds []float64, labels ...string) *Histogram {
	if !slices.IsSorted(bounds) {
		panic("metrics: " + name + ": bounds not ascending")
	}
	h := &Histogram{name: name, help: help, labels: labels, bounds: bounds, vals: map[string]*hsample{}}
	r.add(name, h)
	return h
}

// Observe records v for these label values.
func (h *Histogram) Observe(v float64, values ...string) {
	if len(values) != len(h.labels) {
		panic(fmt.Sprintf("metrics: %s takes %d label values, got %d", h.name, len(h.labels), len(values)))
	}
	k := strings.Join(values, "\xff")
	i, _ := slices.BinarySearch(h.bounds, v) // the first bound >= v; len(bounds): +Inf
	h.mu.Lock()
	s := h.vals[k]
	if s == nil {
		s = &hsample{labels: slices.Clone(values), counts: make([]uint64, len(h.bounds)+1)}
		h.vals[k] = s
	}
	s.counts[i]++
	s.sum += v
	s.n++
	h.mu.Unlock()
}

// Count returns how many values were observed for these label values.
func (h *Histogram) Count(values ...string) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.vals[strings.Join(values, "\xff")]; s != nil {
		return s.n
	}
	return 0
}

func (h *Histogram) write(w *bufio.Writer) {
	header(w, h.name, h.help, "histogram")
	h.mu.Lock()
	keys := make([]string, 0, len(h.vals))
	for k := range h.vals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	samples := make([]hsample, 0, len(keys))
	for _, k := range keys {
		s := h.vals[k]
		samples = append(samples, hsample{labels: s.labels, counts: slices.Clone(s.counts), sum: s.sum, n: s.n})
	}
	h.mu.Unlock()
	for _, s := range samples {
		var cum uint64
		for i, b := range h.bounds {
			cum += s.counts[i]
			line(w, h.name+"_bucket", h.labels, s.labels, "le", formatFloat(b), float64(cum))
		}
		line(w, h.name+"_bucket", h.labels, s.labels, "le", "+Inf", float64(s.n))
		line(w, h.name+"_sum", h.labels, s.labels, "", "", s.sum)
		line(w, h.name+"_count", h.labels, s.labels, "", "", float64(s.n))
	}
}

// Gauge is a family of values read when the registry is written.
type Gauge struct {
	name, help string
	typ        string // gauge, or counter for a total read at scrape time
	labels     []string
	collect    func(emit func(v float64, values ...string))
}

// NewGauge registers a gauge family whose samples collect gives at each
// scrape: it calls emit once per combination of label values. Collect runs
// on the scraping request's goroutine and should be quick and bounded.
func (r *Registry) NewGauge(name, help string, labels []string, collect func(emit func(v float64, values ...string))) {
	r.add(name, &Gauge{name: name, help: help, typ: "gauge", labels: labels, collect: collect})
}

// NewCounterFunc registers a counter family read at scrape time, as
// NewGauge does, for totals another part keeps (the process's CPU time).
func (r *Registry) NewCounterFunc(name, help string, labels []string, collect func(emit func(v float64, values ...string))) {
	r.add(name, &Gauge{name: name, help: help, typ: "counter", labels: labels, collect: collect})
}

func (g *Gauge) write(w *bufio.Writer) {
	type gs struct {
		values []string
		v      float64
	}
	var out []gs
	g.collect(func(v float64, values ...string) {
		if len(values) != len(g.labels) {
			panic(fmt.Sprintf("metrics: %s takes %d label values, got %d", g.name, len(g.labels), len(values)))
		}
		out = append(out, gs{slices.Clone(values), v})
	})
	slices.SortStableFunc(out, func(a, b gs) int { return slices.Compare(a.values, b.values) })
	header(w, g.name, g.help, g.typ)
	for _, s := range out {
		line(w, g.name, g.labels, s.values, "", "", s.v)
	}
}

func header(w *bufio.Writer, name, help, typ string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(help), name, typ)
}

// line writes one sample: name{labels="values",extra="extraValue"} v.
func line(w *bufio.Writer, name string, labels, values []string, extra, extraValue string, v float64) {
	w.WriteString(name)
	if len(labels) > 0 || extra != "" {
		w.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteString(l)
			w.WriteString(`="`)
			w.WriteString(escapeLabel(values[i]))
			w.WriteByte('"')
		}
		if extra != "" {
			if len(labels) > 0 {
				w.WriteByte(',')
			}
			w.WriteString(extra)
			w.WriteString(`="`)
			w.WriteString(escapeLabel(extraValue))
			w.WriteByte('"')
		}
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	w.WriteString(formatFloat(v))
	w.WriteByte('\n')
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }

// validName says whether name is a metric name Prometheus accepts.
func validName(name string) bool {
	if name == "" {
		return false
	}
	for i, c := range name {
		ok := c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9'
		if !ok {
			return false
		}
	}
	return true
}

// DurationBuckets are upper bounds in seconds for operations from a few
// milliseconds (a request answered from memory) to minutes (a large
// snapshot, a long exec).
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60, 300}
