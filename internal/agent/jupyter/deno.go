package jupyter

// DenoReseedCode is an Options.ReseedCode for Deno's kernel. V8 seeds
// Math.random once per process and has no way to reseed it, so every copy
// of one image would go on drawing the same numbers: the code replaces
// Math.random with a xoshiro128** generator seeded from the system's
// randomness (crypto.getRandomValues), with V8's contract (a double in
// [0, 1) with 53 random bits). Like V8's, it is not for secrets: use
// crypto.getRandomValues for those.
func DenoReseedCode() string {
	return `{
  const s = crypto.getRandomValues(new Uint32Array(4));
  if ((s[0] | s[1] | s[2] | s[3]) === 0) s[0] = 1;
  const rotl = (x, k) => (x << k) | (x >>> (32 - k));
  const next = () => {
    const r = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 11);
    return r;
  };
  Object.defineProperty(Math, "random", {
    value: function random() { return (next() * 2 ** 21 + (next() >>> 11)) / 2 ** 53; },
    writable: true, configurable: true, enumerable: false,
  });
}
`
}
