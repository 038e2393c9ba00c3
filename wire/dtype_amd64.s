#include "textflag.h"

DATA k16<>+0(SB)/4, $0x7fffffff  // |x|
DATA k16<>+4(SB)/4, $0x7f800000  // Inf
DATA k16<>+8(SB)/4, $0x80000000  // sign
DATA k16<>+12(SB)/4, $0x7fc00000 // float32's canonical quiet NaN
DATA k16<>+16(SB)/4, $0x00007fff // bf16 rounding bias
DATA k16<>+20(SB)/4, $0x00000001
GLOBL k16<>(SB), RODATA|NOPTR, $24

// canon replaces the NaN lanes of Y0 by the quiet NaN of their sign (uses Y3, Y4; constants in
// Y10-Y13).
#define CANON \
	VPAND     Y10, Y0, Y3 \
	VPCMPGTD  Y11, Y3, Y3 \
	VPAND     Y12, Y0, Y4 \
	VPOR      Y13, Y4, Y4 \
	VPBLENDVB Y3, Y4, Y0, Y0

#define CONSTS \
	VPBROADCASTD k16<>+0(SB), Y10 \
	VPBROADCASTD k16<>+4(SB), Y11 \
	VPBROADCASTD k16<>+8(SB), Y12 \
	VPBROADCASTD k16<>+12(SB), Y13 \
	VPBROADCASTD k16<>+16(SB), Y14 \
	VPBROADCASTD k16<>+20(SB), Y15

// func encodeBF16AVX2(dst *uint16, src *float32, n int)
// n is a multiple of 8: dst[i] = F32ToBF16(src[i]).
TEXT ·encodeBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   bdone
	CONSTS

bloop:
	VMOVDQU      (SI), Y0
	CANON
	VPSRLD       $16, Y0, Y1
	VPAND        Y15, Y1, Y1 // the lowest kept bit: ties to even
	VPADDD       Y14, Y0, Y0
	VPADDD       Y1, Y0, Y0
	VPSRLD       $16, Y0, Y0
	VEXTRACTI128 $1, Y0, X5
	VPACKUSDW    X5, X0, X0
	VMOVDQU      X0, (DI)
	ADDQ         $32, SI
	ADDQ         $16, DI
	DECQ         CX
	JNZ          bloop

bdone:
	VZEROUPPER
	RET

// func encodeF16AVX2(dst *uint16, src *float32, n int)
// n is a multiple of 8: dst[i] = F32ToF16(src[i]) (VCVTPS2PH, round to nearest even, after NaNs
// are made the canonical quiet NaN of their sign, which it turns into 0x7e00 or 0xfe00).
TEXT ·encodeF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   hdone
	CONSTS

hloop:
	VMOVDQU   (SI), Y0
	CANON
	VCVTPS2PH $0, Y0, X0
	VMOVDQU   X0, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       hloop

hdone:
	VZEROUPPER
	RET

// func decodeBF16AVX2(dst *float32, src *byte, n int)
// n is a multiple of 8: dst[i] = BF16ToF32(src[2i:2i+2]) (exact: the 16 bits become the high
// half). src needs no alignment.
TEXT ·decodeBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   ddone

dloop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       dloop

ddone:
	VZEROUPPER
	RET
