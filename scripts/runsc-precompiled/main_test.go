package main

import (
	"go/format"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/sentry/devices/nvproxy/nvconf"
	"gvisor.dev/gvisor/pkg/sentry/platform/ptrace"
	"gvisor.dev/gvisor/pkg/sentry/platform/systrap"
	sentryconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
)

func TestWantedKeepsWhatPandaStackRuns(t *testing.T) {
	sys := (*systrap.Systrap)(nil).SeccompInfo()
	for _, tc := range []struct {
		opt  sentryconfig.Options
		want bool
	}{
		{sentryconfig.Options{Platform: sys}, true},
		{sentryconfig.Options{Platform: sys, HostFilesystem: true}, true},
		{sentryconfig.Options{Platform: sys, HostNetwork: true, HostNetworkRawSockets: true}, true},
		{sentryconfig.Options{Platform: (*ptrace.PTrace)(nil).SeccompInfo()}, false},
		{sentryconfig.Options{Platform: sys, NVProxy: true, NVProxyCaps: nvconf.DefaultDriverCaps}, false},
		{sentryconfig.Options{Platform: sys, TPUProxy: true}, false},
		{sentryconfig.Options{Platform: sys, RDMAProxy: true}, false},
	} {
		key := tc.opt.ConfigKey()
		if got := wanted(key); got != tc.want {
			t.Errorf("wanted(%s) = %v, want %v", key, got, tc.want)
		}
	}
}

func TestRenderIsValidGo(t *testing.T) {
	src, err := render(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"package filter", "PrecompilationDisabledAtBuildTime = false", "func GetPrecompiled(", "func ListPrecompiled("} {
		if !strings.Contains(string(src), s) {
			t.Errorf("rendered file lacks %q", s)
		}
	}
}

func TestApplyEditsFailsOnUnknownSource(t *testing.T) {
	if _, err := applyEdits("package systrap\n", systrapEdits); err == nil {
		t.Fatal("applyEdits accepted a source without the expected lines")
	}
	src := "\tvars := precompiledseccomp.Values{}\n\t\t\tseccomp.EqualTo(os.Getpid()),\n"
	got, err := applyEdits(src, systrapEdits)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(got, "EqualTo(os.Getpid())") || !strings.Contains(got, `vars.GetUint64("`+systrapPIDVar+`")`) {
		t.Errorf("patched source still compares with the builder's PID:\n%s", got)
	}
	if _, err := applyEdits(src+src, systrapEdits); err == nil {
		t.Fatal("applyEdits accepted a source with the lines twice")
	}
}

// The pages file edits apply to source shaped as gVisor's and leave valid
// Go with the reader sized by the CPUs; a source without those lines fails.
func TestPagesEdits(t *testing.T) {
	src := "package stateio\n\nimport (\n\t\"gvisor.dev/gvisor/pkg/hostarch\"\n)\n\n" +
		"const (\n\tpagesFileFDDefaultMaxIOBytes  = 256 << 10\n\tpagesFileFDDefaultMaxParallel = 128\n)\n\n" +
		"func NewPagesFileFDReader(fd int32, maxReadBytes uint64, maxParallel int) *FDReader {\n" +
		"\treturn NewFDReader(fd, maxReadBytes, int(maxReadBytes/hostarch.PageSize), maxParallel)\n}\n\n" +
		"func NewPagesFileFDReaderDefault(fd int32) *FDReader {\n" +
		"\treturn NewPagesFileFDReader(fd, pagesFileFDDefaultMaxIOBytes, pagesFileFDDefaultMaxParallel)\n}\n"
	got := patched(t, src, pagesEdits)
	if !strings.Contains(got, "NewPagesFileFDReader(fd, pagesFileFDDefaultMaxIOBytes, pandastackReadParallel())") || !strings.Contains(got, "runtime.NumCPU()") {
		t.Errorf("the reader is not sized by the CPUs:\n%s", got)
	}
	if !strings.Contains(got, "r.pw.mapSource(fd)") {
		t.Errorf("a pages file's reader does not map its source:\n%s", got)
	}
}

// The reader edits apply to source shaped as gVisor's FDReader and leave
// valid Go in which each read first tries the pwrite path, a partial write
// goes on on it, and Close releases it. (The tagged pwrite test checks the
// patched reader itself, in the gVisor copy.)
func TestFDReaderEdits(t *testing.T) {
	src := "package stateio\n\n" +
		"type FDReader struct {\n\tinflight []fdRead\n\tcs       []aio.Completion\n}\n\n" +
		"type fdRead struct {\n\toff   int64\n\tdst   LocalClientRanges\n}\n\n" +
		"func (r *FDReader) Close() error {\n\tr.q.Destroy()\n\treturn nil\n}\n\n" +
		"func (r *FDReader) AddRead(id int, off int64, _ DestinationFile, _ memmap.FileRange, dstMap []byte) {\n\tread()\n}\n\n" +
		"func (r *FDReader) AddReadv(id int, off int64, total uint64, _ DestinationFile, _ []memmap.FileRange, dstMaps []unix.Iovec) {\n\treadv()\n}\n\n" +
		"func (r *FDReader) Wait() {\n\tfor {\n\t\tswitch {\n\t\tdefault:\n\t\t\tif x {\n" +
		"\t\t\t} else {\n\t\t\t\tinflight.dst = inflight.dst.DropFirst(n)\n\t\t\t\tif inflight.dst.Mapping != nil {\n" +
		"\t\t\t\t\tread()\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n"
	got := patched(t, src, fdreaderEdits)
	for _, want := range []string{
		"pw       pandastackPwrite",
		"pw    pandastackPwriteRead",
		"r.q.Destroy()\n\tr.pw.release()",
		"if r.pw.add(r, id, off, uint64(len(dstMap)), df, []memmap.FileRange{dstFR}) {\n\t\treturn\n\t}\n\tread()",
		"if r.pw.add(r, id, off, total, df, dstFRs) {\n\t\treturn\n\t}\n\treadv()",
		"if inflight.pw.active {\n\t\t\t\t\tr.pw.next(r.q, aioC.ID, inflight, n)\n\t\t\t\t} else if inflight.dst.Mapping != nil {",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("patched reader lacks %q:\n%s", want, got)
		}
	}
}

// The files -patch adds are gofmt-clean Go of the packages they go to.
func TestAddedSourcesAreGo(t *testing.T) {
	for name, c := range map[string]struct{ src, pkg string }{
		"pwriteSource":         {pwriteSource, "stateio"},
		"pwriteTestSource":     {pwriteTestSource, "stateio"},
		"holesSource":          {holesSource, "pgalloc"},
		"holesTestSource":      {holesTestSource, "pgalloc"},
		"gcSource":             {gcSource, "kernel"},
		"gcTestSource":         {gcTestSource, "kernel"},
		"syncSource":           {syncSource, "gofer"},
		"signalsSource":        {signalsSource, "sighandling"},
		"signalsTestSource":    {signalsTestSource, "sighandling"},
		"fdtableSource":        {fdtableSource, "pandastackfd"},
		"fdtableTestSource":    {fdtableTestSource, "pandastackfd"},
		"startSource":          {startSource, "kernel"},
		"startTestSource":      {startTestSource, "kernel"},
		"statsTestSource":      {statsTestSource, "state"},
		"wireByteSource":       {wireByteSource, "wire"},
		"wireTestSource":       {wireTestSource, "wire"},
		"compressioByteSource": {compressioByteSource, "compressio"},
		"compressioTestSource": {compressioTestSource, "compressio"},
	} {
		src := c.src
		out, err := format.Source([]byte(src))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(out) != src {
			t.Errorf("%s is not gofmt-clean", name)
		}
		if !strings.Contains(src, "\npackage "+c.pkg+"\n") {
			t.Errorf("%s is not of package %s", name, c.pkg)
		}
	}
}

// The kernel edits apply to source shaped as gVisor's SaveTo, LoadFrom and
// Start and leave valid Go that sets the collector for the state's encode
// and decode alone (until a first cycle), puts it back before either's
// error returns, formats their statistics for a debug log alone, and adds
// the start's Ps before the task goroutines start.
func TestKernelEdits(t *testing.T) {
	src := "package kernel\n\nimport (\n\t\"path/filepath\"\n\t\"time\"\n)\n\n" +
		"func save() {\n\tfunc() {\n" +
		"\t\t// Save the kernel state.\n\t\tkernelStart := time.Now()\n\t\tstats, err := state.Save(ctx, stateFile, k)\n" +
		"\t\tif err != nil {\n\t\t\treturn err\n\t\t}\n\t\tlog.Infof(\"Kernel save stats: %s\", stats.String())\n\t\t_ = kernelStart\n\t}()\n}\n\n" +
		"func load() {\n\t_ = filepath.Join\n" +
		"\t// Load the kernel state.\n\tkernelStart := time.Now()\n\tstats, err := state.Load(ctx, r, k)\n" +
		"\tif err != nil {\n\t\treturn err\n\t}\n\tlog.Infof(\"Kernel load stats: %s\", stats.String())\n\t_ = kernelStart\n}\n\n" +
		"func start(ts []*Task) {\n\t// Start task goroutines.\n\tfor _, t := range ts {\n\t\tt.Start(t.ThreadID())\n\t}\n}\n"
	got := patched(t, src, kernelEdits)
	if want := "\tpandastackBoostProcs(pandastackStartProcs, pandastackStartSpan)\n\t// Start task goroutines.\n\tfor _, t := range ts {\n"; !strings.Contains(got, want) || strings.Count(got, "pandastackBoostProcs(") != 1 {
		t.Errorf("the start's Ps are not added once, before the task goroutines start:\n%s", got)
	}
	saveFn, loadFn := got[:strings.Index(got, "func load()")], got[strings.Index(got, "func load()"):strings.Index(got, "func start(")]
	for _, c := range []struct{ name, fn, around, stats string }{
		{"encode", saveFn,
			"\t\tpandastackGC, pandastackSet := pandastackEncodeGC()\n" +
				"\t\tpandastackStop := func() {}\n" +
				"\t\tif pandastackSet {\n" +
				"\t\t\tpandastackStop = pandastackAfterFirstCycle(func() { debug.SetGCPercent(pandastackGC) })\n" +
				"\t\t}\n" +
				"\t\tstats, err := state.Save(ctx, stateFile, k)\n" +
				"\t\tpandastackStop()\n" +
				"\t\tif pandastackSet {\n\t\t\tdebug.SetGCPercent(pandastackGC)\n\t\t}\n" +
				"\t\tif err != nil {\n",
			"\t\tif log.IsLogging(log.Debug) {\n\t\t\tlog.Debugf(\"Kernel save stats: %s\", stats.String())\n\t\t}\n"},
		{"decode", loadFn,
			"\tpandastackGC := debug.SetGCPercent(-1)\n" +
				"\tpandastackLimit := debug.SetMemoryLimit(256 << 20)\n" +
				"\tpandastackStop := pandastackAfterFirstCycle(func() {\n" +
				"\t\tdebug.SetMemoryLimit(pandastackLimit)\n" +
				"\t\tdebug.SetGCPercent(pandastackGC)\n" +
				"\t})\n" +
				"\tstats, err := state.Load(ctx, r, k)\n" +
				"\tpandastackStop()\n" +
				"\tdebug.SetMemoryLimit(pandastackLimit)\n" +
				"\tdebug.SetGCPercent(pandastackGC)\n" +
				"\tif err != nil {\n",
			"\tif log.IsLogging(log.Debug) {\n\t\tlog.Debugf(\"Kernel load stats: %s\", stats.String())\n\t}\n"},
	} {
		if !strings.Contains(c.fn, c.around) || strings.Count(c.fn, "SetGCPercent(") != strings.Count(c.around, "SetGCPercent(") {
			t.Errorf("the collector is not set around the %s alone, or not put back before its error returns:\n%s", c.name, c.fn)
		}
		if !strings.Contains(c.fn, c.stats) || strings.Count(c.fn, "stats.String()") != 1 {
			t.Errorf("the %s's statistics are formatted without a debug log:\n%s", c.name, c.fn)
		}
	}
	if !strings.Contains(got, "\"runtime/debug\"") {
		t.Errorf("runtime/debug is not imported:\n%s", got)
	}
}

// The timekeeper edits apply to source shaped as gVisor's update and leave
// valid Go that takes the next sample soon only while the clocks are not
// ready.
func TestTimekeeperEdits(t *testing.T) {
	src := "package kernel\n\nimport \"time\"\n\n" +
		"func (t *Timekeeper) update(parked bool) {\n" +
		"\tif err := t.params.Write(func() vdsoParams {\n\t\tres := t.clocks.Update(parked)\n" +
		"\t\tvar p vdsoParams\n\t\t_ = res\n\t\treturn p\n" +
		"\t}); err != nil {\n" +
		"\t\tlog.Warningf(\"Unable to update VDSO parameter page: %v\", err)\n\t}\n}\n\nvar _ = time.Second\n"
	got := patched(t, src, timekeeperEdits)
	ready := strings.Index(got, "pandastackReady = res.MonotonicOk && res.RealtimeOk")
	reset := strings.Index(got, "if !pandastackReady {\n\t\tt.timer.Reset(pandastackCalibrationInterval)")
	if ready < 0 || reset < ready || !strings.Contains(got, "pandastackCalibrationInterval = 20 * time.Millisecond") {
		t.Errorf("the next sample is not brought forward while the clocks are not ready:\n%s", got)
	}
}

// The save's edit applies to source shaped as gVisor's scan and leaves
// valid Go that asks for the next data before it reads a page, and reads
// no page of a hole.
func TestSaveEdits(t *testing.T) {
	src := "package pgalloc\n\nfunc scan() {\n\tfor maseg.Ok() {\n" +
		"\t\tf.forEachChunk(fr, func(chunk *chunkInfo, chunkFR memmap.FileRange) bool {\n" +
		"\t\t\tbs := chunk.sliceAt(chunkFR)\n" +
		"\t\t\tfor pgoff := 0; pgoff < len(bs); pgoff += hostarch.PageSize {\n" +
		"\t\t\t\tpg := bs[pgoff : pgoff+hostarch.PageSize]\n" +
		"\t\t\t\toff := chunkFR.Start + uint64(pgoff)\n" +
		"\t\t\t\tisZeroed := bytes.Equal(pg, zeroPage)\n\t\t\t\t_, _ = off, isZeroed\n" +
		"\t\t\t}\n\t\t\treturn true\n\t\t})\n\t}\n}\n"
	got := patched(t, src, saveEdits)
	next := strings.Index(got, "pandastackNextData(int(f.file.Fd()), off, chunkFR.End)")
	skip := strings.Index(got, "pgoff = int(off - chunkFR.Start)")
	read := strings.Index(got, "pg := bs[pgoff : pgoff+hostarch.PageSize]")
	disk := strings.Index(got, "if f.opts.DiskBackedFile {\n\t\t\t\tdataEnd = chunkFR.End\n\t\t\t}")
	if disk < 0 || disk > next {
		t.Errorf("a disk-backed memory file is looked at for holes:\n%s", got)
	}
	if next < 0 || !(next < skip && skip < read) || !strings.Contains(got, "maseg = updateAddRange(maseg, hole, wasCommitted, false)") {
		t.Errorf("the scan does not skip a hole before it reads a page:\n%s", got)
	}
}

// The gofer's edit applies to source shaped as gVisor's PrepareSave and
// leaves valid Go that flushes through the added function, not Sync.
func TestGoferSaveEdits(t *testing.T) {
	src := "package gofer\n\nfunc (fs *filesystem) PrepareSave(ctx context.Context) error {\n" +
		"\t// Flush local state to the remote filesystem.\n\tif err := fs.Sync(ctx); err != nil {\n\t\treturn err\n\t}\n" +
		"\treturn fs.root.prepareSaveRecursive(ctx)\n}\n"
	got := patched(t, src, goferSaveEdits)
	if strings.Contains(got, "fs.Sync(ctx)") || !strings.Contains(got, "if err := fs.pandastackSyncWritten(ctx); err != nil {\n\t\treturn err") {
		t.Errorf("the checkpoint's flush is not the written files' alone:\n%s", got)
	}
}

// The signal edits apply to source shaped as gVisor's forwarding and its
// loader's wait for the start, and leave valid Go that starts a prepared
// forwarding when there is one and prepares it before the wait.
func TestSignalEdits(t *testing.T) {
	src := "package sighandling\n\nfunc StartSignalForwarding(handler func(linux.Signal)) func() {\n" +
		"\tstop := make(chan struct{})\n\tdone := make(chan struct{})\n\t_ = done\n\treturn func() { close(stop) }\n}\n"
	got := patched(t, src, signalEdits)
	prepared := strings.Index(got, "if stop, ok := pandastackStartPrepared(handler); ok {\n\t\treturn stop\n\t}")
	own := strings.Index(got, "\tstop := make(chan struct{})")
	if prepared < 0 || own < prepared {
		t.Errorf("the forwarding does not take a prepared one first:\n%s", got)
	}
	src = "package boot\n\nfunc (l *Loader) WaitForStartSignal() {\n\t<-l.ctrl.manager.startChan\n}\n"
	got = patched(t, src, loaderEdits)
	prepare := strings.Index(got, "sighandling.PrepareSignalForwarding()")
	wait := strings.Index(got, "<-l.ctrl.manager.startChan")
	if prepare < 0 || wait < prepare {
		t.Errorf("the forwarding is not prepared before the wait for the start:\n%s", got)
	}
}

// The boot edits apply to source shaped as gVisor's boot command and leave
// valid Go that imports the package and grows the fd table once the fd
// limit is set, before the loader is made.
func TestBootEdits(t *testing.T) {
	src := "package sentrycmd\n\nimport (\n\t\"gvisor.dev/gvisor/pkg/log\"\n\t\"gvisor.dev/gvisor/pkg/metric\"\n\t\"gvisor.dev/gvisor/pkg/prometheus\"\n)\n\n" +
		"func execute() {\n\tif conf.FDLimit > -1 {\n\t\ttimer.Reached(\"FD limit applied\")\n\t}\n\n\tl, err := boot.New(bootArgs)\n\t_, _ = l, err\n}\n"
	got := patched(t, src, bootEdits)
	if !strings.Contains(got, "\t\"gvisor.dev/gvisor/pkg/pandastackfd\"\n") {
		t.Errorf("the package is not imported:\n%s", got)
	}
	limit := strings.Index(got, "timer.Reached(\"FD limit applied\")\n\t}")
	grow := strings.Index(got, "pandastackfd.GrowTable(pandastackfd.TableSize)")
	loader := strings.Index(got, "boot.New(bootArgs)")
	if limit < 0 || grow < limit || loader < grow {
		t.Errorf("the fd table is not grown between the fd limit and the loader:\n%s", got)
	}
}

// The stats edits apply to source shaped as gVisor's stats.go and leave
// valid Go whose collecting methods return at once unless the log is at
// debug level, and whose table divides by its count only when there is one.
func TestStatsEdits(t *testing.T) {
	src := "package state\n\nimport (\n\t\"time\"\n\n\t\"gvisor.dev/gvisor/pkg/gohacks\"\n)\n\n" +
		"type Stats struct {\n\t// last is the monotonic time of the last sample.\n\tlast int64\n}\n\n" +
		"func (s *Stats) init() {\n\ts.last = gohacks.Nanotime()\n}\n\n" +
		"func (s *Stats) fini(resolve func(id typeID) string) {\n\ts.done()\n}\n\n" +
		"func (s *Stats) start(id typeID) {\n\ts.sample(id)\n}\n\n" +
		"func (s *Stats) done() {\n\ts.sample(0)\n}\n\n" +
		"func (s *Stats) String() string {\n\tvar total time.Duration\n\tvar count uint\n" +
		"\tfmt.Fprintf(&buf, \"% 16s | % 8d | % 16s | [all]\",\n\t\ttotal, count, total/time.Duration(count))\n\treturn \"\"\n}\n"
	got := patched(t, src, statsEdits)
	if !strings.Contains(got, "\t\"gvisor.dev/gvisor/pkg/log\"\n") || !strings.Contains(got, "\ton bool\n}") {
		t.Errorf("the log is not imported or the field not added:\n%s", got)
	}
	for _, fn := range []string{"init() {\n\tif s.on = log.IsLogging(log.Debug); !s.on {\n\t\treturn", "fini(resolve func(id typeID) string) {\n\tif !s.on {\n\t\treturn", "start(id typeID) {\n\tif !s.on {\n\t\treturn", "done() {\n\tif !s.on {\n\t\treturn"} {
		if !strings.Contains(got, fn) {
			t.Errorf("%q does not return at once:\n%s", fn[:strings.Index(fn, "{")], got)
		}
	}
	if strings.Contains(got, "total/time.Duration(count)") || !strings.Contains(got, "if count > 0 {\n\t\tper = total / time.Duration(count)") {
		t.Errorf("the table still divides by a count of zero:\n%s", got)
	}
}

// The wire edits apply to source shaped as gVisor's wire.go and leave
// valid Go whose readByte asks a source with ReadByte before it reads.
func TestWireEdits(t *testing.T) {
	src := "package wire\n\nimport \"io\"\n\ntype Reader struct {\n\tio.Reader\n\n\tbuf [1]byte\n}\n\n" +
		"func (r *Reader) readByte() byte {\n\tn, err := r.Read(r.buf[:])\n\tif n != 1 {\n\t\tpanic(err)\n\t}\n\treturn r.buf[0]\n}\n"
	got := patched(t, src, wireEdits)
	ask := strings.Index(got, "if br := r.pb.of(r.Reader); br != nil {\n\t\treturn r.pb.read(br)")
	read := strings.Index(got, "n, err := r.Read(r.buf[:])")
	if !strings.Contains(got, "\tpb pandastackBytes") || ask < 0 || read < ask {
		t.Errorf("readByte does not ask for ReadByte first:\n%s", got)
	}
}

// patched applies edits to src, checks that the result is valid Go and
// that the edits do not apply to it a second time, and returns it.
func patched(t *testing.T, src string, edits []edit) string {
	t.Helper()
	got, err := applyEdits(src, edits)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := format.Source([]byte(got)); err != nil {
		t.Fatalf("patched source does not parse: %v\n%s", err, got)
	}
	if _, err := applyEdits(got, edits); err == nil {
		t.Fatal("the edits applied twice")
	}
	return got
}
