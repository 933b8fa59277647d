package main

import (
	"math"
	"sort"
)

// Stat is the summary of repeated measurements of one figure.
type Stat struct {
	Group  string  `json:"group"` // the chart panel it belongs to
	Name   string  `json:"name"`
	Unit   string  `json:"unit"`
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P95    float64 `json:"p95"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Target is the goal for the median (and TargetP95 for the p95) from
	// the issue named in TargetSource; zero when there is none.
	Target       float64 `json:"target,omitempty"`
	TargetP95    float64 `json:"target_p95,omitempty"`
	TargetSource string  `json:"target_source,omitempty"`
	Note         string  `json:"note,omitempty"`
	// HigherIsBetter marks rates (MB/s): their p95 is the slow tail, the
	// value 95% of the runs reached or beat (the 5th percentile).
	HigherIsBetter bool      `json:"higher_is_better,omitempty"`
	Samples        []float64 `json:"samples"`
}

// summarize computes median and p95 by nearest rank, so both are values
// that were measured.
func summarize(group, name, unit string, xs []float64, note string) Stat {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	st := Stat{Group: group, Name: name, Unit: unit, N: len(s), Note: note, Samples: round3(xs)}
	if len(s) == 0 {
		return st
	}
	q := func(p float64) float64 { return s[int(math.Round(p*float64(len(s)-1)))] }
	st.Median, st.P95, st.Min, st.Max = q(0.5), q(0.95), s[0], s[len(s)-1]
	return st
}

// summarizeRate is summarize for figures where more is better.
func summarizeRate(group, name, unit string, xs []float64, note string) Stat {
	st := summarize(group, name, unit, xs, note)
	if st.N > 0 {
		s := append([]float64(nil), xs...)
		sort.Float64s(s)
		st.P95, st.HigherIsBetter = s[int(math.Round(0.05*float64(len(s)-1)))], true
	}
	return st
}

// withTarget sets the goal of a figure; p95 may be 0 for none.
func (s Stat) withTarget(median, p95 float64, source string) Stat {
	s.Target, s.TargetP95, s.TargetSource = median, p95, source
	return s
}

// met says whether the figure meets its targets.
func (s Stat) met() bool {
	if s.HigherIsBetter { // a rate: the target is a floor
		return s.N > 0 && (s.Target == 0 || s.Median >= s.Target) && (s.TargetP95 == 0 || s.P95 >= s.TargetP95)
	}
	return s.N > 0 && (s.Target == 0 || s.Median <= s.Target) && (s.TargetP95 == 0 || s.P95 <= s.TargetP95)
}

// cmp is how the target reads: "≤", or "≥" for a rate.
func (s Stat) cmp() string {
	if s.HigherIsBetter {
		return "≥"
	}
	return "≤"
}

func round3(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = math.Round(x*1000) / 1000
	}
	return out
}

// ratios divides a by b element-wise (the two series were measured in
// alternation, so pairs share the machine's conditions).
func ratios(a, b []float64) []float64 {
	out := make([]float64, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}
