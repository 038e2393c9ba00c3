#include "textflag.h"

// func addBF16AVX2(dst *float32, src *uint16, n int)
// n is a multiple of 16. dst[i] = dst[i] + float32frombits(uint32(src[i]) << 16).
TEXT ·addBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   bfdone

bfloop:
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y2
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y2, Y2
	VMOVUPS   (DI), Y1
	VMOVUPS   32(DI), Y3
	VADDPS    Y0, Y1, Y1 // Y1 = Y1 + Y0: dst first, as dst[i] += x
	VADDPS    Y2, Y3, Y3
	VMOVUPS   Y1, (DI)
	VMOVUPS   Y3, 32(DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       bfloop

bfdone:
	VZEROUPPER
	RET

// func addF16AVX2(dst *float32, src *uint16, n int)
// n is a multiple of 16. dst[i] = dst[i] + (src[i] as IEEE binary16, converted exactly).
TEXT ·addF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   hdone

hloop:
	VCVTPH2PS (SI), Y0
	VCVTPH2PS 16(SI), Y2
	VMOVUPS   (DI), Y1
	VMOVUPS   32(DI), Y3
	VADDPS    Y0, Y1, Y1
	VADDPS    Y2, Y3, Y3
	VMOVUPS   Y1, (DI)
	VMOVUPS   Y3, 32(DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       hloop

hdone:
	VZEROUPPER
	RET
