//go:build !linux

package metrics

func readProc() (procStat, bool) { return procStat{}, false }
