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
p = os.path.join(tempfile.mkdtemp(), 'f.ttf')
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
print(sorted(n for n in globals() if 'pandastack' in n))
`

const fontCheckWant = "glyphs from memory\nfname True\npng True\npdf True\n[]\n"

// TestMemFontsAfterImport: in a kernel with the setup code, matplotlib's
// fonts come from memory from the cell after the one that imported it.
func TestMemFontsAfterImport(t *testing.T) {
	k := startKernel(t, guarded)
	if e, _ := runCode(t, k, "import matplotlib.pyplot as plt", ExecOptions{}); e.Error != nil {
		t.Fatalf("import: %+v", e.Error)
	}
	e, _ := runCode(t, k, fontCheck, ExecOptions{})
	if e.Error != nil || e.Stdout != fontCheckWant {
		t.Fatalf("error %+v, stdout:\n%s\nwant:\n%s", e.Error, e.Stdout, fontCheckWant)
	}
}

// TestMemFontsCode: PythonMemFontsCode run silently after a warm-up (as a
// spare kernel's prime does) takes effect at once, and twice is harmless;
// without it a font is read from its file, which the check can tell.
func TestMemFontsCode(t *testing.T) {
	k := startKernel(t)
	if e, _ := runCode(t, k, "import matplotlib.pyplot as plt", ExecOptions{}); e.Error != nil {
		t.Fatalf("import: %+v", e.Error)
	}
	e, _ := runCode(t, k, fontCheck, ExecOptions{})
	if !strings.HasPrefix(e.Stdout, "glyphs from the file\n") {
		t.Fatalf("without the code: error %+v, stdout:\n%s", e.Error, e.Stdout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		if err := k.RunSilent(ctx, PythonMemFontsCode); err != nil {
			t.Fatal(err)
		}
	}
	e, _ = runCode(t, k, fontCheck, ExecOptions{})
	if e.Error != nil || e.Stdout != fontCheckWant {
		t.Fatalf("error %+v, stdout:\n%s\nwant:\n%s", e.Error, e.Stdout, fontCheckWant)
	}
}
