package functions

import "unsafe"

// FoldApply is one step of one shard with every rank's payload at hand: u.Grad is set to the
// rank-order sum of the little-endian float32 payloads srcs[0..N-1] (as SumLE) and f is applied
// (as f.Apply(u)), with the same bits as SumLE(u.Grad, srcs) followed by f.Apply(u).
//
// For sgd, momentum (and nesterov), adam (and adamw) and adagrad without clip_norm it is one pass: the sum is computed a block of
// sumBlock elements at a time, and the block is updated while it is still in the L1 cache, so
// each payload, parameter and state is read once from memory. Clipping needs the norm of the
// whole mean gradient before any parameter changes, so with clip_norm > 0 (and for the other
// functions) FoldApply sums everything first and then applies: two passes, the same bits.
// On return u.Grad holds scratch values (as after Apply). It panics as SumLE and Apply do.
func FoldApply(f Func, u *Update, srcs [][]byte) {
	if len(srcs) == 0 {
		panic("functions: FoldApply of no payloads")
	}
	for _, s := range srcs {
		checkLen(len(u.Grad), s)
	}
	foldApply(f, u, srcs)
}

// AddApply is the last rank's fold of a runtime that folds its ranks as they arrive: u.Grad
// holds the rank-order sum of ranks 0..N-2, src is rank N-1's little-endian payload, and it has
// the bits of AddLE(u.Grad, src) followed by f.Apply(u), in one pass where FoldApply has one. It
// panics unless len(src) == 4*len(u.Grad).
func AddApply(f Func, u *Update, src []byte) {
	checkLen(len(u.Grad), src)
	if !littleEndian { // u.Grad's memory is not a little-endian payload there
		AddLE(u.Grad, src)
		f.Apply(u)
		return
	}
	// The partial sum is rank "0" of a two-payload fold into itself (its memory is its
	// little-endian encoding on this machine): each block of it is read before it is written.
	srcs := [2][]byte{asBytes(u.Grad), src}
	foldApply(f, u, srcs[:])
}

// foldApply is FoldApply without its checks of srcs.
func foldApply(f Func, u *Update, srcs [][]byte) {
	// A type switch rather than a call through the interface, which would move k to the heap.
	var k applyConsts
	switch f := f.(type) {
	case *sgd:
		if f.begin(u, &k) {
			for lo := 0; lo < len(u.Params); lo += sumBlock {
				hi := min(lo+sumBlock, len(u.Params))
				sumRange(u.Grad[lo:hi], srcs, lo)
				f.block(u, &k, lo, hi)
			}
			return
		}
	case *adam:
		if f.begin(u, &k) {
			for lo := 0; lo < len(u.Params); lo += sumBlock {
				hi := min(lo+sumBlock, len(u.Params))
				sumRange(u.Grad[lo:hi], srcs, lo)
				f.block(u, &k, lo, hi)
			}
			return
		}
	case *momentum:
		if f.begin(u, &k) {
			for lo := 0; lo < len(u.Params); lo += sumBlock {
				hi := min(lo+sumBlock, len(u.Params))
				sumRange(u.Grad[lo:hi], srcs, lo)
				f.block(u, &k, lo, hi)
			}
			return
		}
	case *adagrad:
		if f.begin(u, &k) {
			for lo := 0; lo < len(u.Params); lo += sumBlock {
				hi := min(lo+sumBlock, len(u.Params))
				sumRange(u.Grad[lo:hi], srcs, lo)
				f.block(u, &k, lo, hi)
			}
			return
		}
	}
	sumRange(u.Grad, srcs, 0)
	f.Apply(u)
}

// fusable is a function whose update of element i reads only element i of the sum, parameters
// and state, so that FoldApply may update a block as soon as it is summed.
type fusable interface {
	// begin checks u (panicking like Apply) and sets k to the update's constants; it returns
	// false, having changed nothing, when this configuration needs the whole sum first.
	begin(u *Update, k *applyConsts) bool
	// block performs the update of elements lo..hi-1, the same arithmetic as Apply's.
	block(u *Update, k *applyConsts, lo, hi int)
}

var _, _, _, _ fusable = (*sgd)(nil), (*adam)(nil), (*momentum)(nil), (*adagrad)(nil)

// applyConsts are an update's per-Apply constants.
type applyConsts struct {
	adam adamConsts // adam; sgd uses adam.s only
}

// adamConsts is laid out for adamAVX: s, b1, b2, omb1, omb2, eps, sqrtBC2, step.
type adamConsts struct {
	s, b1, b2, omb1, omb2, eps, sqrtBC2, step float32
}

// The update loops. Each runs its first multiple of 8 elements in assembly when useSIMD is set,
// the rest (or everything) in Go; both perform the same float32 operations per element.

// sgdLoop: p[i] -= float32(lr*float32(g[i]*s)).
func sgdLoop(p, g []float32, s, lr float32) {
	g = g[:len(p)]
	if k := len(p) &^ 7; useSIMD && k > 0 {
		sgdAVX(&p[0], &g[0], k, s, lr)
		p, g = p[k:], g[k:]
	}
	for i := range p {
		p[i] -= float32(lr * float32(g[i]*s))
	}
}

// sgdWDLoop: d = float32(g[i]*s) + float32(wd*p[i]); p[i] -= float32(lr*d).
func sgdWDLoop(p, g []float32, s, lr, wd float32) {
	g = g[:len(p)]
	if k := len(p) &^ 7; useSIMD && k > 0 {
		sgdWDAVX(&p[0], &g[0], k, s, lr, wd)
		p, g = p[k:], g[k:]
	}
	for i := range p {
		pi, gi := p[i], g[i]
		d := float32(gi*s) + float32(wd*pi)
		p[i] = pi - float32(lr*d)
	}
}

// addDecay sets g[i] = float32(g[i]*s) + float32(wd*p[i]): the L2 term of sgd, momentum, adam
// and adagrad. Its result is the scaled gradient, so the callers continue with s = 1.
func addDecay(g []float32, s, wd float32, p []float32) {
	g = g[:len(p)]
	if k := len(p) &^ 7; useSIMD && k > 0 {
		decayAVX(&g[0], &p[0], k, s, wd)
		p, g = p[k:], g[k:]
	}
	for i := range p {
		g[i] = float32(g[i]*s) + float32(wd*p[i])
	}
}

// scaleLoop: p[i] = float32(p[i]*c) (adamw's decoupled decay).
func scaleLoop(p []float32, c float32) {
	if len(p) > 0 && useSIMD {
		scaleSIMD(p, c, unsafe.Pointer(&p[0]))
		return
	}
	for i := range p {
		p[i] = float32(p[i] * c)
	}
}

// scaleSIMD sets dst[i] = float32(w*x[i]) for the len(dst) > 0 float32s x at src (any alignment,
// little-endian).
func scaleSIMD(dst []float32, w float32, src unsafe.Pointer) {
	n := len(dst)
	k := n &^ 7
	if k > 0 {
		scaleAVX(&dst[0], src, k, w)
	}
	if k == n {
		return // (unsafe.Add past the end is not allowed)
	}
	tail := unsafe.Slice((*byte)(unsafe.Add(src, 4*k)), 4*(n-k))
	for i := range n - k {
		dst[k+i] = float32(w * le(tail[4*i:]))
	}
}

// axpySIMD sets dst[i] += float32(w*x[i]), as scaleSIMD.
func axpySIMD(dst []float32, w float32, src unsafe.Pointer) {
	n := len(dst)
	k := n &^ 7
	if k > 0 {
		axpyAVX(&dst[0], src, k, w)
	}
	if k == n {
		return // (unsafe.Add past the end is not allowed)
	}
	tail := unsafe.Slice((*byte)(unsafe.Add(src, 4*k)), 4*(n-k))
	for i := range n - k {
		dst[k+i] += float32(w * le(tail[4*i:]))
	}
}

// adamLoop is Adam's update of m, v and p from g (see the package doc).
func adamLoop(p, g, m, v []float32, k *adamConsts) {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	if n := len(p) &^ 7; useSIMD && n > 0 {
		adamAVX(&p[0], &g[0], &m[0], &v[0], n, k)
		p, g, m, v = p[n:], g[n:], m[n:], v[n:]
	}
	s, b1, b2, omb1, omb2, eps, sqrtBC2, step := k.s, k.b1, k.b2, k.omb1, k.omb2, k.eps, k.sqrtBC2, k.step
	for i := range p {
		pi, gi, mi, vi := p[i], float32(g[i]*s), m[i], v[i]
		mi = float32(b1*mi) + float32(omb1*gi)
		vi = float32(b2*vi) + float32(omb2*float32(gi*gi))
		denom := float32(sqrt32(vi)/sqrtBC2) + eps
		m[i], v[i] = mi, vi
		p[i] = pi - float32(step*float32(mi/denom))
	}
}
