package jupyter

import (
	"context"
	"strings"
	"testing"
	"time"
)

// fontCheck copies matplotlib's default font to a file of its own, has
// matplotlib load it, then empties the file: a font read from the file
// fails on its next glyph, one read from memory goes on drawing. The
// figure's PNG and PDF (which embeds the font from fname) must still work.
const fontCheck = `import os, shutil, tempfile, io
import matplotlib.font_manager as fm
d = tempfile.mkdtemp()
try:
    p = os.path.join(d, 'f.ttf')
    shutil.copy(fm.findfont('DejaVu Sans'), p)
    font = fm.get_font(p)
    open(p, 'w').close()
    try:
        font.set_text('Hello, world', 0.0)
        print('glyphs from', 'memory' if font.get_width_height()[0] > 0 else 'nowhere')
    except RuntimeError:
        print('glyphs from the file')
    print('fname', font.fname == p)
    fig = plt.figure()
    plt.plot([1, 2, 3])
    plt.title('a title')
    for fmt in ('png', 'pdf'):
        b = io.BytesIO()
        fig.savefig(b, format=fmt)
        print(fmt, len(b.getvalue()) > 1000)
    plt.close(fig)
finally:
    shutil.rmtree(d, ignore_errors=True)
print(sorted(n for n in globals() if 'pandastack' in n))
`

const fontCheckWant = "glyphs from memory\nfname True\npng True\npdf True\n[]\n"

// TestPlotsCode: PythonPlotsCode run silently after a warm-up (as a spare
// kernel's prime does) takes effect at once, and twice is harmless;
// without it a font is read from its file, which the check can tell.
func TestPlotsCode(t *testing.T) {
	k := startKernel(t)
	mustStdout(t, k, firstFigure, "")
	e, _ := runCode(t, k, fontCheck, ExecOptions{})
	if !strings.HasPrefix(e.Stdout, "glyphs from the file\n") {
		t.Fatalf("without the code: error %+v, stdout:\n%s", e.Error, e.Stdout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		if err := k.RunSilent(ctx, PythonPlotsCode); err != nil {
			t.Fatal(err)
		}
	}
	mustStdout(t, k, fontCheck, fontCheckWant)
	mustStdout(t, k, pngCheck, pngCheckWant)
}

// pngCheck compares what the PNG formatter gives for two figures with
// matplotlib's own tight PNG: one drawn within the figure (the single-draw
// path: same size, same picture up to antialiasing), one with its legend
// past the figure's edge (matplotlib's own path: the same bytes).
const pngCheck = `import base64, io
import numpy as np
from PIL import Image
from matplotlib.figure import Figure
from IPython.core.pylabtools import print_figure
fmt = get_ipython().display_formatter.formatters['image/png'].lookup_by_type(Figure)
print('single draw', getattr(fmt, '_pandastack', False))
fig = plt.figure()
plt.plot([1, 3, 2], label='a')
plt.xlabel('x')
plt.title('a title')
ours = np.asarray(Image.open(io.BytesIO(base64.b64decode(fmt(fig)))).convert('RGBA')).astype(int)
theirs = np.asarray(Image.open(io.BytesIO(print_figure(fig, 'png', bbox_inches='tight'))).convert('RGBA')).astype(int)
print('same size', ours.shape == theirs.shape)
print('same picture', ours.shape == theirs.shape and (np.abs(ours - theirs).max(axis=2) > 64).mean() < 0.05)
plt.legend(loc='upper left', bbox_to_anchor=(1.02, 1))
print('outside: matplotlib path', base64.b64decode(fmt(fig)) == print_figure(fig, 'png', bbox_inches='tight'))
plt.close('all')
`

const pngCheckWant = "single draw True\nsame size True\nsame picture True\noutside: matplotlib path True\n"

// TestPlotsHook: in a kernel with the setup code, from the cell after its
// first figure (which sets up the inline backend's formatters), fonts come
// from memory and a displayed figure is drawn once; plt.show still gives a
// PNG.
func TestPlotsHook(t *testing.T) {
	k := startKernel(t, guarded)
	mustStdout(t, k, firstFigure, "")
	mustStdout(t, k, fontCheck, fontCheckWant)
	mustStdout(t, k, pngCheck, pngCheckWant)
	e, _ := runCode(t, k, "plt.plot([1, 2])\nplt.show()", ExecOptions{})
	if e.Error != nil || e.PNG == "" {
		t.Fatalf("plt.show: error %+v, PNG of %d bytes", e.Error, len(e.PNG))
	}
	// A figure closed before it is shown (its canvas is then matplotlib's
	// base one) goes matplotlib's own way.
	e, _ = runCode(t, k, "closed = plt.figure()\nplt.plot([3, 1])\nplt.close(closed)\nclosed", ExecOptions{})
	if e.Error != nil || e.PNG == "" {
		t.Fatalf("a closed figure: error %+v, PNG of %d bytes", e.Error, len(e.PNG))
	}
}

const firstFigure = "import matplotlib.pyplot as plt\nplt.close(plt.figure())"

// mustStdout runs code and fails unless it prints want without an error.
func mustStdout(t *testing.T, k *testKernel, code, want string) {
	t.Helper()
	e, _ := runCode(t, k, code, ExecOptions{})
	if e.Error != nil || e.Stdout != want {
		t.Fatalf("error %+v, stdout:\n%s\nwant:\n%s", e.Error, e.Stdout, want)
	}
}
