//! The arena buffer and safe carving of disjoint typed views out of it.

use crate::kernels::{In, Out};
use rlx_ir::DType;
use std::ops::Range;

/// A byte region of the arena holding one tensor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub offset: usize,
    pub bytes: usize,
    pub dtype: DType,
}

impl Region {
    fn words(&self) -> Range<usize> {
        self.offset / 8..(self.offset + self.bytes).div_ceil(8)
    }
}

/// Typed read view of `bytes` (which start at word boundary `base`) for `r`.
fn typed_in<'a>(words: &'a [u64], base: usize, r: Region) -> Option<In<'a>> {
    let bytes: &'a [u8] = bytemuck::cast_slice(words);
    let start = r.offset - base * 8;
    let b = bytes.get(start..start + r.bytes)?;
    Some(match r.dtype {
        DType::F32 => In::F32(bytemuck::try_cast_slice(b).ok()?),
        DType::I32 => In::I32(bytemuck::try_cast_slice(b).ok()?),
        DType::I64 => In::I64(bytemuck::try_cast_slice(b).ok()?),
        DType::U8 | DType::Bool => In::U8(b),
        DType::F16 | DType::BF16 => return None,
    })
}

fn typed_out<'a>(words: &'a mut [u64], base: usize, r: Region) -> Option<Out<'a>> {
    let bytes: &'a mut [u8] = bytemuck::cast_slice_mut(words);
    let start = r.offset - base * 8;
    let b = bytes.get_mut(start..start + r.bytes)?;
    Some(match r.dtype {
        DType::F32 => Out::F32(bytemuck::try_cast_slice_mut(b).ok()?),
        DType::I32 => Out::I32(bytemuck::try_cast_slice_mut(b).ok()?),
        DType::I64 => Out::I64(bytemuck::try_cast_slice_mut(b).ok()?),
        DType::U8 | DType::Bool => Out::U8(b),
        DType::F16 | DType::BF16 => return None,
    })
}

/// Carve mutable views for `outs` and shared views for `ins` out of one
/// arena. Returns `None` if an output overlaps another output or an input:
/// the memory plan forbids that, so `None` is a planner bug.
pub(crate) fn split_io<'a>(
    arena: &'a mut [u64],
    outs: &[Region],
    ins: &[Region],
) -> Option<(Vec<Out<'a>>, Vec<In<'a>>)> {
    let mut order: Vec<usize> = (0..outs.len()).collect();
    order.sort_by_key(|&i| outs[i].offset);
    let mut out_views: Vec<Option<Out<'a>>> = (0..outs.len()).map(|_| None).collect();
    let mut pieces: Vec<(usize, &'a [u64])> = Vec::new();
    let mut rest: &'a mut [u64] = arena;
    let mut cursor = 0usize;
    for &i in &order {
        let w = outs[i].words();
        if w.start < cursor || w.end > cursor + rest.len() {
            return None;
        }
        let (before, after) = rest.split_at_mut(w.start - cursor);
        pieces.push((cursor, before));
        let (mine, after) = after.split_at_mut(w.len());
        out_views[i] = Some(typed_out(mine, w.start, outs[i])?);
        rest = after;
        cursor = w.end;
    }
    pieces.push((cursor, rest));
    let mut in_views = Vec::with_capacity(ins.len());
    for r in ins {
        let w = r.words();
        let (base, piece) = pieces
            .iter()
            .find(|(b, p)| *b <= w.start && w.end <= b + p.len())?;
        in_views.push(typed_in(&piece[w.start - base..w.end - base], w.start, *r)?);
    }
    Some((
        out_views
            .into_iter()
            .map(|o| o.expect("every output carved"))
            .collect(),
        in_views,
    ))
}

/// A typed mutable view of one region (for binding inputs and poisoning).
pub(crate) fn region_mut(arena: &mut [u64], r: Region) -> Option<&mut [u8]> {
    let w = r.words();
    let words = arena.get_mut(w.clone())?;
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(words);
    let start = r.offset - w.start * 8;
    bytes.get_mut(start..start + r.bytes)
}

/// A shared byte view of one region.
pub(crate) fn region(arena: &[u64], r: Region) -> Option<&[u8]> {
    let w = r.words();
    let words = arena.get(w.clone())?;
    let bytes: &[u8] = bytemuck::cast_slice(words);
    let start = r.offset - w.start * 8;
    bytes.get(start..start + r.bytes)
}
