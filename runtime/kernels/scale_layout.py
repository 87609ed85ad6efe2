"""How FP8 block scales are laid out for the GPU kernel: every scale row starts on a 4-byte word.

fp8_triton_kernel.py reads a row's e8m0 scale bytes through the aligned int32 words that hold them (one
wide load instead of a narrow one per row). On a GPU a word read from an address that is not a multiple
of 4 faults ("misaligned address", sticky for the rest of the process), and a word read of a tensor's
last bytes runs up to 3 bytes past its end. The interpreter runs both happily, so the layout is an
invariant checked at every launch, on the CPU too: scales are held as a [R, KB] view of a buffer whose
rows are padded to a multiple of 4 bytes (row views then stay aligned: rows() cuts whole rows), and the
kernel walks rows by the view's stride.
Legend: R scale rows (ceil(N / 128)), KB scale columns (ceil(K / 128)).
"""

from __future__ import annotations

import torch

WORD = 4
PAD_BYTE = 127  # e8m0 2^0: what a masked lane reads too


def word_aligned(scale: torch.Tensor) -> torch.Tensor:
    """scale [R, KB] (1-byte e8m0) as a view whose rows start on 4-byte words in a buffer padded to whole
    words; the same tensor when it is already laid out so."""
    if is_word_aligned(scale):
        return scale
    R, KB = scale.shape
    padded = -(-KB // WORD) * WORD
    buf = torch.full((R, padded), PAD_BYTE, dtype=torch.uint8, device=scale.device)  # [R, KB padded]
    buf[:, :KB] = scale.view(torch.uint8)
    return buf[:, :KB].view(scale.dtype)


def is_word_aligned(scale: torch.Tensor) -> bool:
    """Rows start on words (pointer and row stride multiples of 4), bytes contiguous along a row, and the
    storage holds whole words past the last row's last byte."""
    if scale.dim() != 2 or scale.element_size() != 1 or scale.stride(1) != 1:
        return False
    R = scale.shape[0]
    row = scale.stride(0)
    end = scale.storage_offset() + row * R            # bytes the word reads may touch, from the storage start
    return (scale.data_ptr() % WORD == 0 and row % WORD == 0 and row >= scale.shape[1]
            and end <= scale.untyped_storage().nbytes())


def check_word_aligned(scale: torch.Tensor, where: str) -> None:
    if not is_word_aligned(scale):
        raise ValueError(f"{where}: FP8 scales [{', '.join(map(str, scale.shape))}] (row stride "
                         f"{scale.stride(0) if scale.dim() == 2 else '?'}, address {scale.data_ptr()} mod 4 = "
                         f"{scale.data_ptr() % WORD}) are not laid out on 4-byte words: hold them through "
                         f"runtime/kernels/scale_layout.word_aligned (a GPU would fault: misaligned address)")
