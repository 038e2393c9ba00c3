#include "textflag.h"

// AVX kernels for amd64 (simd_amd64.go describes them). Every one processes n float32s, n a
// multiple of 8, with unaligned loads and stores (VMOVUPS), and performs per element exactly the
// float32 operations of the Go loop it replaces, in the same order: VADDPS, VSUBPS, VMULPS,
// VDIVPS and VSQRTPS are correctly rounded like their scalar counterparts. No FMA instruction is
// used. In Go's operand order, VSUBPS Y1, Y0, Y2 sets Y2 = Y0 - Y1.

// func foldAVX2(dst *float32, srcs *unsafe.Pointer, nsrc, n int)
// dst[i] = ((srcs[0][i] + srcs[1][i]) + srcs[2][i]) + ... for i < n, 32 elements in four
// registers at a time, every rank added to them before they are stored.
TEXT ·foldAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ srcs+8(FP), SI
	MOVQ nsrc+16(FP), CX
	MOVQ n+24(FP), DX
	SHLQ $2, DX             // bytes
	XORQ AX, AX             // byte offset
	MOVQ DX, R10
	ANDQ $-128, R10         // end of the 128-byte iterations
fold128:
	CMPQ AX, R10
	JGE  fold32
	MOVQ (SI), BX
	VMOVUPS (BX)(AX*1), Y0
	VMOVUPS 32(BX)(AX*1), Y1
	VMOVUPS 64(BX)(AX*1), Y2
	VMOVUPS 96(BX)(AX*1), Y3
	MOVQ $1, R9
rank128:
	CMPQ R9, CX
	JGE  store128
	MOVQ (SI)(R9*8), BX
	VADDPS (BX)(AX*1), Y0, Y0
	VADDPS 32(BX)(AX*1), Y1, Y1
	VADDPS 64(BX)(AX*1), Y2, Y2
	VADDPS 96(BX)(AX*1), Y3, Y3
	INCQ R9
	JMP  rank128
store128:
	VMOVUPS Y0, (DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	VMOVUPS Y2, 64(DI)(AX*1)
	VMOVUPS Y3, 96(DI)(AX*1)
	ADDQ $128, AX
	JMP  fold128
fold32:
	CMPQ AX, DX
	JGE  folddone
	MOVQ (SI), BX
	VMOVUPS (BX)(AX*1), Y0
	MOVQ $1, R9
rank32:
	CMPQ R9, CX
	JGE  store32
	MOVQ (SI)(R9*8), BX
	VADDPS (BX)(AX*1), Y0, Y0
	INCQ R9
	JMP  rank32
store32:
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP  fold32
folddone:
	VZEROUPPER
	RET

// func sgdAVX(p, grad *float32, n int, s, lr float32)
// p[i] = p[i] - float32(lr*float32(g[i]*s))
TEXT ·sgdAVX(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ n+16(FP), DX
	SHLQ $2, DX
	VMOVSS s+24(FP), X14
	VBROADCASTSS X14, Y14
	VMOVSS lr+28(FP), X15
	VBROADCASTSS X15, Y15
	XORQ AX, AX
sgdloop:
	CMPQ AX, DX
	JGE  sgddone
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS (DI)(AX*1), Y1
	VMULPS Y14, Y0, Y0      // g*s
	VMULPS Y0, Y15, Y0      // lr*(g*s)
	VSUBPS Y0, Y1, Y1       // p - lr*(g*s)
	VMOVUPS Y1, (DI)(AX*1)
	ADDQ $32, AX
	JMP  sgdloop
sgddone:
	VZEROUPPER
	RET

// func sgdWDAVX(p, grad *float32, n int, s, lr, wd float32)
// d = float32(g[i]*s) + float32(wd*p[i]); p[i] = p[i] - float32(lr*d)
TEXT ·sgdWDAVX(SB), NOSPLIT, $0-36
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ n+16(FP), DX
	SHLQ $2, DX
	VMOVSS s+24(FP), X13
	VBROADCASTSS X13, Y13
	VMOVSS lr+28(FP), X14
	VBROADCASTSS X14, Y14
	VMOVSS wd+32(FP), X15
	VBROADCASTSS X15, Y15
	XORQ AX, AX
sgdwdloop:
	CMPQ AX, DX
	JGE  sgdwddone
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS (DI)(AX*1), Y1
	VMULPS Y13, Y0, Y0      // g*s
	VMULPS Y1, Y15, Y2      // wd*p
	VADDPS Y2, Y0, Y0       // d
	VMULPS Y0, Y14, Y0      // lr*d
	VSUBPS Y0, Y1, Y1       // p - lr*d
	VMOVUPS Y1, (DI)(AX*1)
	ADDQ $32, AX
	JMP  sgdwdloop
sgdwddone:
	VZEROUPPER
	RET

// func decayAVX(grad, p *float32, n int, s, wd float32)
// g[i] = float32(g[i]*s) + float32(wd*p[i])
TEXT ·decayAVX(SB), NOSPLIT, $0-32
	MOVQ grad+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), DX
	SHLQ $2, DX
	VMOVSS s+24(FP), X14
	VBROADCASTSS X14, Y14
	VMOVSS wd+28(FP), X15
	VBROADCASTSS X15, Y15
	XORQ AX, AX
decayloop:
	CMPQ AX, DX
	JGE  decaydone
	VMOVUPS (DI)(AX*1), Y0
	VMOVUPS (SI)(AX*1), Y1
	VMULPS Y14, Y0, Y0      // g*s
	VMULPS Y1, Y15, Y1      // wd*p
	VADDPS Y1, Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP  decayloop
decaydone:
	VZEROUPPER
	RET

// func scaleAVX(dst *float32, src unsafe.Pointer, n int, c float32)
// dst[i] = float32(src[i]*c)
TEXT ·scaleAVX(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), DX
	SHLQ $2, DX
	VMOVSS c+24(FP), X15
	VBROADCASTSS X15, Y15
	XORQ AX, AX
scaleloop:
	CMPQ AX, DX
	JGE  scaledone
	VMOVUPS (SI)(AX*1), Y0
	VMULPS Y15, Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP  scaleloop
scaledone:
	VZEROUPPER
	RET

// func axpyAVX(dst *float32, src unsafe.Pointer, n int, w float32)
// dst[i] = dst[i] + float32(w*src[i])
TEXT ·axpyAVX(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), DX
	SHLQ $2, DX
	VMOVSS w+24(FP), X15
	VBROADCASTSS X15, Y15
	XORQ AX, AX
axpyloop:
	CMPQ AX, DX
	JGE  axpydone
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS (DI)(AX*1), Y1
	VMULPS Y0, Y15, Y0      // w*src
	VADDPS Y0, Y1, Y1       // dst + w*src
	VMOVUPS Y1, (DI)(AX*1)
	ADDQ $32, AX
	JMP  axpyloop
axpydone:
	VZEROUPPER
	RET

// func adamAVX(p, grad, m, v *float32, n int, k *adamConsts)
// k: s, b1, b2, omb1, omb2, eps, sqrtBC2, step (float32s, in that order).
//	gi = float32(g*s)
//	m = float32(b1*m) + float32(omb1*gi)
//	v = float32(b2*v) + float32(omb2*float32(gi*gi))
//	denom = float32(sqrt(v)/sqrtBC2) + eps
//	p = p - float32(step*float32(m/denom))
TEXT ·adamAVX(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), DX
	SHLQ $2, DX
	MOVQ k+40(FP), BX
	VBROADCASTSS 0(BX), Y8   // s
	VBROADCASTSS 4(BX), Y9   // b1
	VBROADCASTSS 8(BX), Y10  // b2
	VBROADCASTSS 12(BX), Y11 // omb1
	VBROADCASTSS 16(BX), Y12 // omb2
	VBROADCASTSS 20(BX), Y13 // eps
	VBROADCASTSS 24(BX), Y14 // sqrtBC2
	VBROADCASTSS 28(BX), Y15 // step
	XORQ AX, AX
adamloop:
	CMPQ AX, DX
	JGE  adamdone
	VMOVUPS (SI)(AX*1), Y0  // g
	VMOVUPS (R8)(AX*1), Y1  // m
	VMOVUPS (R9)(AX*1), Y2  // v
	VMOVUPS (DI)(AX*1), Y3  // p
	VMULPS Y8, Y0, Y0       // gi = g*s
	VMULPS Y1, Y9, Y1       // b1*m
	VMULPS Y0, Y11, Y4      // omb1*gi
	VADDPS Y4, Y1, Y1       // m
	VMULPS Y2, Y10, Y2      // b2*v
	VMULPS Y0, Y0, Y5       // gi*gi
	VMULPS Y5, Y12, Y5      // omb2*(gi*gi)
	VADDPS Y5, Y2, Y2       // v
	VSQRTPS Y2, Y6          // sqrt(v)
	VDIVPS Y14, Y6, Y6      // sqrt(v)/sqrtBC2
	VADDPS Y13, Y6, Y6      // denom
	VDIVPS Y6, Y1, Y7       // m/denom
	VMULPS Y7, Y15, Y7      // step*(m/denom)
	VSUBPS Y7, Y3, Y3       // p - ...
	VMOVUPS Y1, (R8)(AX*1)
	VMOVUPS Y2, (R9)(AX*1)
	VMOVUPS Y3, (DI)(AX*1)
	ADDQ $32, AX
	JMP  adamloop
adamdone:
	VZEROUPPER
	RET

// func momentumAVX(p, grad, v *float32, n int, k *[4]float32, mode int)
// k: s, mu, damp1, lr. With d = float32(grad[i]*s):
//	mode 0: v = float32(mu*v) + float32(damp1*d); p = p - float32(lr*v)
//	mode 1 (Nesterov): v as mode 0; d = d + float32(mu*v); p = p - float32(lr*d)
//	mode 2 (step 1): v = d; p = p - float32(lr*d)
//	mode 3 (step 1, Nesterov): v = d; d = d + float32(mu*d); p = p - float32(lr*d)
TEXT ·momentumAVX(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ v+16(FP), R8
	MOVQ n+24(FP), DX
	SHLQ $2, DX
	MOVQ k+32(FP), BX
	MOVQ mode+40(FP), CX
	VBROADCASTSS 0(BX), Y12  // s
	VBROADCASTSS 4(BX), Y13  // mu
	VBROADCASTSS 8(BX), Y14  // damp1
	VBROADCASTSS 12(BX), Y15 // lr
	XORQ AX, AX
	CMPQ CX, $1
	JEQ  mnest
	CMPQ CX, $2
	JEQ  mfirst
	CMPQ CX, $3
	JEQ  mfirstnest
mplain:
	CMPQ AX, DX
	JGE  mdone
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS (R8)(AX*1), Y1
	VMOVUPS (DI)(AX*1), Y2
	VMULPS Y12, Y0, Y0      // d = g*s
	VMULPS Y1, Y13, Y1      // mu*v
	VMULPS Y0, Y14, Y3      // damp1*d
	VADDPS Y3, Y1, Y1       // v
	VMULPS Y1, Y15, Y4      // lr*v
	VSUBPS Y4, Y2, Y2       // p - lr*v
	VMOVUPS Y1, (R8)(AX*1)
	VMOVUPS Y2, (DI)(AX*1)
	ADDQ $32, AX
	JMP  mplain
mnest:
	CMPQ AX, DX
	JGE  mdone
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS (R8)(AX*1), Y1
	VMOVUPS (DI)(AX*1), Y2
	VMULPS Y12, Y0, Y0      // d = g*s
	VMULPS Y1, Y13, Y1      // mu*v
	VMULPS Y0, Y14, Y3      // damp1*d
	VADDPS Y3, Y1, Y1       // v
	VMULPS Y1, Y13, Y4      // mu*v
	VADDPS Y4, Y0, Y0       // d + mu*v
	VMULPS Y0, Y15, Y4      // lr*d
	VSUBPS Y4, Y2, Y2       // p - lr*d
	VMOVUPS Y1, (R8)(AX*1)
	VMOVUPS Y2, (DI)(AX*1)
	ADDQ $32, AX
	JMP  mnest
mfirst:
	CMPQ AX, DX
	JGE  mdone
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS (DI)(AX*1), Y2
	VMULPS Y12, Y0, Y0      // d = g*s
	VMULPS Y0, Y15, Y4      // lr*d
	VSUBPS Y4, Y2, Y2       // p - lr*d
	VMOVUPS Y0, (R8)(AX*1)  // v = d
	VMOVUPS Y2, (DI)(AX*1)
	ADDQ $32, AX
	JMP  mfirst
mfirstnest:
	CMPQ AX, DX
	JGE  mdone
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS (DI)(AX*1), Y2
	VMULPS Y12, Y0, Y0      // d = g*s
	VMOVUPS Y0, (R8)(AX*1)  // v = d
	VMULPS Y0, Y13, Y4      // mu*d
	VADDPS Y4, Y0, Y0       // d + mu*d
	VMULPS Y0, Y15, Y4      // lr*d
	VSUBPS Y4, Y2, Y2       // p - lr*d
	VMOVUPS Y2, (DI)(AX*1)
	ADDQ $32, AX
	JMP  mfirstnest
mdone:
	VZEROUPPER
	RET

// func adagradAVX(p, grad, acc *float32, n int, k *[4]float32)
// k: s, lr, eps. gi = float32(grad[i]*s); acc = acc + float32(gi*gi);
// p = p - float32(lr*float32(gi/(sqrt(acc)+eps)))
TEXT ·adagradAVX(SB), NOSPLIT, $0-40
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ acc+16(FP), R8
	MOVQ n+24(FP), DX
	SHLQ $2, DX
	MOVQ k+32(FP), BX
	VBROADCASTSS 0(BX), Y12 // s
	VBROADCASTSS 4(BX), Y13 // lr
	VBROADCASTSS 8(BX), Y14 // eps
	XORQ AX, AX
agloop:
	CMPQ AX, DX
	JGE  agdone
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS (R8)(AX*1), Y1
	VMOVUPS (DI)(AX*1), Y2
	VMULPS Y12, Y0, Y0      // gi = g*s
	VMULPS Y0, Y0, Y3       // gi*gi
	VADDPS Y3, Y1, Y1       // acc + gi*gi
	VSQRTPS Y1, Y4
	VADDPS Y14, Y4, Y4      // sqrt(acc) + eps
	VDIVPS Y4, Y0, Y5       // gi/(...)
	VMULPS Y5, Y13, Y5      // lr*(...)
	VSUBPS Y5, Y2, Y2       // p - ...
	VMOVUPS Y1, (R8)(AX*1)
	VMOVUPS Y2, (DI)(AX*1)
	ADDQ $32, AX
	JMP  agloop
agdone:
	VZEROUPPER
	RET
