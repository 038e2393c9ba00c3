#include "textflag.h"

// func addBF16AVX2(dst *float32, src *byte, n int)
// src is little-endian bf16 at any address (VEX loads need no alignment).
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

// func addF16AVX2(dst *float32, src *byte, n int)
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

// func cvtBF16AVX2(dst *float32, src *byte, n int)
// n is a multiple of 8. dst[i] = float32frombits(uint32(src[i]) << 16).
TEXT ·cvtBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   cbdone

cbloop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       cbloop

cbdone:
	VZEROUPPER
	RET

DATA f16k<>+0(SB)/4, $0x7e00   // exponent and quiet bit of a half
DATA f16k<>+4(SB)/4, $0x7c00   // exponent all ones, quiet bit clear
DATA f16k<>+8(SB)/4, $0x1ff    // the rest of a NaN's payload
DATA f16k<>+12(SB)/4, $0x400000 // float32's quiet bit
GLOBL f16k<>(SB), RODATA|NOPTR, $16

// func cvtF16AVX2(dst *float32, src *byte, n int)
// n is a multiple of 8. dst[i] = src[i] as binary16 converted exactly: VCVTPH2PS, except that it
// quiets a signaling NaN, whose quiet bit is cleared again (the payload is kept either way).
TEXT ·cvtF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   chdone
	VPBROADCASTD f16k<>+0(SB), Y4
	VPBROADCASTD f16k<>+4(SB), Y5
	VPBROADCASTD f16k<>+8(SB), Y6
	VPBROADCASTD f16k<>+12(SB), Y7
	VPXOR        Y8, Y8, Y8

chloop:
	VCVTPH2PS (SI), Y0
	VPMOVZXWD (SI), Y1
	VPAND     Y4, Y1, Y2
	VPCMPEQD  Y5, Y2, Y2 // exponent all ones, quiet bit clear
	VPAND     Y6, Y1, Y3
	VPCMPEQD  Y8, Y3, Y3 // no payload below the quiet bit
	VPANDN    Y2, Y3, Y2 // Y2 = ^Y3 & Y2: a signaling NaN
	VPAND     Y7, Y2, Y2
	VPXOR     Y2, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       chloop

chdone:
	VZEROUPPER
	RET
