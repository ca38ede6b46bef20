"""NKI backward kernel of multi-scale deformable attention (nkilib signature; see docs/api.md and docs/kernels.md, "Backward").

Design (details and the scatter-uniqueness proof in ``backward_config``):
- One sample row (q, h, l) per partition, N_p points in the free dims; T blocks of whole
  queries per super-tile. Coordinates, floors, masks and weights in fp32 (real floor; NaN
  coordinates sanitized and masked; hostile values clamped before any index is formed).
- Gathers (only when grad_sampling_locations or grad_attention_weights is wanted): indirect
  ``dma_transpose`` of <= 128-channel chunks (2-byte values; multi-column uint32 index tiles
  batch M_g columns; no cap = upstream's packet limit) plus PE transposes back, or indirect
  ``dma_copy`` (any dtype; with no cap or a cap >= 256 and BNLC one index fetches the (x0, x1)
  corner pair as one 2*C_h run; BLNC pairs only with ``strided_pairs``). fp32 values always take the copy path (dma_transpose is 2-byte only).
- Channel tiles: grad_output, gathered rows and scatter data hold C_t channels; a C_h too
  wide for SBUF is processed in ceil(C_h / C_t) passes per super-tile (dot products summed
  over the passes in fp32); C_t = C_h (one pass) whenever it fits.
- grad_value: ``dma_compute`` scatter-RMW into K replicated fp32 buffers with unique indices
  per instruction (``max_scatter_indices_per_indirect`` <= 128 sets the partitions per
  scatter and so K; with no cap P_s and K minimise the estimated DMA work of buffers + scatter;
  no cap or >= 256 writes x-corner pairs as for the gathers), ``num_scatter_buffers`` sets
  (default 1) take successive scatter DMAs round robin,
  fixed-order reduction, one cast. LNC=2: per-core buffers, core_barrier, row-banded reduce.
- Pipelining (plan.pipelined; transpose gathers, one channel tile, unfolded scatter, where SBUF
  allows): super-tile i + 1 is loaded, prepared and gathered before super-tile i's scatter data
  and scatters, so GpSimd's scatter descriptors overlap the Vector engine's next dot products;
  the scatter data rotates over several tiles (docs/kernels.md, "Pipelining the backward").

Buffer dtype (``grad_value_buffers_in`` / ``dump_grad_value_buffers``): float32, shape
(B, lnc*K, L*N_h, C_h), rows in value's layout order (BLNC: pix*N_h + h; BNLC: h*L + pix).
``iota_k_scale``: (128, 1) int32, the row offset k(j)*R of the buffer partition j writes
(pass it back only to calls with the same shapes and scatter knobs; a given buffer set fixes K).
``reduced_grad_value`` / ``prev_reduced_grad_value``: float32 with value's shape (the raw sum
of the buffers, before subtracting ``prev_reduced_grad_value``).

Out-of-map corners (and NaN samples) are removed bitwise from the corner dot products, the pair
selects and the scatter data, so inf/NaN at their clamped pixels never leaks (docs/kernels.md,
"Coordinate math"). LNC degree and core: kernel_commons.core_info; one barrier per buffer set.

Code on the kernel path compares with ``== None`` / ``!= None``: the emulator's pre-0.7 source
rules (still enforced by the tests) reject ``is``.
"""

from __future__ import annotations

from nkilib_msda._nki import nisa, nki, nl
from nkilib_msda.experimental.deformable_attention import backward_buffers as bufs
from nkilib_msda.experimental.deformable_attention import backward_sampling as smp
from nkilib_msda.experimental.deformable_attention import coordinates as crd
from nkilib_msda.experimental.deformable_attention.plan.backward_config import plan_backward
from nkilib_msda.experimental.deformable_attention.backward_gather import CornerGather
from nkilib_msda.experimental.deformable_attention.corner_blocks import (build_corner_blocks,
                                                                       scratch_rows_per_batch)
from nkilib_msda.experimental.deformable_attention.backward_live_rows import LiveRows
from nkilib_msda.experimental.deformable_attention.backward_scatter import GradValueScatter
from nkilib_msda.experimental.deformable_attention.backward_tiles import allocate_tiles
from nkilib_msda.experimental.kernel_commons import (core_barrier, core_info, explain_argument_errors,
                                                     kernel_sbuf_budget)
from nkilib_msda.validation.msda import KERNEL_PADDING_MODES, dtype_name, validate_msda_args

__all__ = ["ms_deformable_attention_bwd"]

# fp32 bit patterns of the grad_output row scaling (``_grad_scales``)
_EXPONENT_BITS = 0x7F800000
_TWO_POW_127_BITS = 0x7F000000
_TWO_POW_MINUS_126_BITS = 0x00800000
_ONE_BITS = 0x3F800000


def _check_tensor(name: str, t, shape, dtype: str) -> None:
    if t == None:  # noqa: E711
        return
    got = (tuple(t.shape), dtype_name(t.dtype))
    if got != (tuple(shape), dtype):
        raise ValueError(f"{name}: expected shape {tuple(shape)} and dtype {dtype}, got shape {got[0]} "
                         f"and dtype {got[1]}")


def _check_reuse(cfg, value, num_scatter_buffers, iota_k_scale_in, grad_value_buffers_in,
                 prev_reduced_grad_value, dump_grad_value_buffers, dump_reduced_grad_value) -> None:
    _check_tensor("iota_k_scale_in", iota_k_scale_in, cfg.iota_k_scale_shape, "int32")
    needs_value = {"grad_value_buffers_in": grad_value_buffers_in != None,  # noqa: E711
                   "prev_reduced_grad_value": prev_reduced_grad_value != None,
                   "dump_grad_value_buffers": bool(dump_grad_value_buffers),
                   "dump_reduced_grad_value": bool(dump_reduced_grad_value)}
    for name, used in needs_value.items():
        if used and not cfg.compute_grad_value:
            raise ValueError(f"{name}: needs compute_grad_value=True (the buffers only exist for grad_value)")
    _check_tensor("grad_value_buffers_in", grad_value_buffers_in, cfg.buffer_shape, "float32")
    if grad_value_buffers_in != None and num_scatter_buffers not in (None, 1):  # noqa: E711
        raise ValueError(f"num_scatter_buffers: expected None or 1 with grad_value_buffers_in, "
                         f"got {num_scatter_buffers!r}")
    _check_tensor("prev_reduced_grad_value", prev_reduced_grad_value, value.shape, "float32")


def _rows_ap(flat2d, row0: int, parts: int, blocks: int, rows_per_block: int):
    """(parts, blocks, width) view of rows row0 + t*rows_per_block + j of a 2-D HBM tensor."""
    width = flat2d.shape[1]
    return flat2d.ap([[width, parts], [rows_per_block * width, blocks], [1, width]], offset=row0 * width)


@nki.jit
def ms_deformable_attention_bwd(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                                attention_weights, value_layout="BLNC", sampling_locations_layout="BQHLP2",
                                align_corners=False, padding_mode="zeros", max_gather_indices_per_indirect=None,
                                max_scatter_indices_per_indirect=None, gather_method="transpose",
                                num_scatter_buffers=None, compute_grad_value=True,
                                compute_grad_sampling_locations=True, compute_grad_attention_weights=True,
                                iota_k_scale_in=None, grad_value_buffers_in=None, prev_reduced_grad_value=None,
                                dump_iota_k_scale=False, dump_grad_value_buffers=False,
                                dump_reduced_grad_value=False, strided_pairs=False, gather_layout="auto"):
    """Gradients of multi-scale deformable attention with respect to value, sampling_locations
    and attention_weights (docs/api.md, docs/kernels.md "Backward").

    Dimensions:
        B, N_q, N_h, C_h, N_l, N_p, L: as in ``ms_deformable_attention``.
        S = B * N_q * N_h * N_l: sample rows, one (query, head, level) per partition.
        K: replicated fp32 grad_value buffers per core (from the scatter cap, see Notes).
        C_t: channels per channel tile (C_h unless one row of C_h does not fit SBUF).

    Args:
        grad_output (HBM tensor): (B, N_q, N_h * C_h) in value's dtype.
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
        value_layout, sampling_locations_layout, align_corners, padding_mode: as in the
            forward kernel (same shapes, layouts and dtypes).
        max_gather_indices_per_indirect (int | None): cap on indices per indirect gather.
        max_scatter_indices_per_indirect (int | None): partitions per grad_value scatter
            (<= 128 sets K; None: the P_s of least estimated DMA work, see backward_config).
        gather_method (str): "transpose" (2-byte values) or "copy" (any dtype; float32 always).
        num_scatter_buffers (int | None): buffer sets that successive scatters take round
            robin (default 1).
        compute_grad_value, compute_grad_sampling_locations, compute_grad_attention_weights
            (bool): which gradients to compute; the gathers run only for the last two.
        iota_k_scale_in (HBM tensor | None): (128, 1) int32 from an earlier call's
            ``dump_iota_k_scale`` with the same shapes and scatter knobs.
        grad_value_buffers_in (HBM tensor | None): (B, lnc * K, L * N_h, C_h) float32 buffers
            to accumulate into (rows in value's layout order: BLNC pix * N_h + h, BNLC h * L + pix).
        prev_reduced_grad_value (HBM tensor | None): float32, value's shape; subtracted from
            the reduced buffers (accumulating calls).
        dump_iota_k_scale, dump_grad_value_buffers, dump_reduced_grad_value (bool): also
            return those intermediates.
        strided_pairs (bool): opt-in (default False, not in AWS's API): x-corner pairs also for
            BLNC or channel-tiled rows, where the two rows are not one contiguous run (a
            three-level indirect pattern no NKI page documents; docs/conformance.md).
        gather_layout (str): "auto" (default), "corner-block" or "four-corner", as in the
            forward (not in AWS's API): with corner blocks the kernel first builds the
            forward's corner-block scratch of value (about 4x value bytes of HBM) and gathers
            one 4*C_h run per sample instead of four C_h rows (2-byte values, transpose
            gather, C_h <= 32; "auto" where the forward's density rule picks it). Only the
            gathers change; the grad_value scatter is the same.

    Returns:
        tuple of shared-HBM tensors: the enabled gradients in the order grad_value (value's
        shape, layout and dtype), grad_sampling_locations (the locations' shape and layout,
        float32), grad_attention_weights ((B, N_q, N_h, N_l, N_p), value's dtype); then the
        enabled dumps in the order iota_k_scale, grad_value_buffers (set 0),
        reduced_grad_value (float32, the raw buffer sum before ``prev_reduced_grad_value``).

    Notes:
        - Coordinates, weights and every dot product are float32; grad_value is accumulated in
          float32 buffers and cast once after a fixed-order reduction of the buffers.
        - The grad_value scatter is a read-modify-write ``dma_compute`` whose indices are
          unique within each instruction (proof in ``backward_config``): colliding samples land
          in different replicated buffers.
        - Out-of-map corners and NaN samples are removed bitwise from the dot products, pair
          selects and scatter data.
        - Any C_h: when the C_h-wide tiles do not fit SBUF, the plan splits the channels into
          tiles of C_t (a multiple of 128 on the transpose path) and each super-tile makes one
          gather/scatter pass per tile; only N_p is bounded by SBUF (the error names it).
        - LNC=2: each core scatters into its own buffers; one core barrier per buffer set, then
          each core reduces a band of rows. The plan comes from ``backward_config.plan_backward``
          (plain Python) before any instruction is emitted.

    Pseudocode:
        plan = plan_backward(problem, lnc, knobs, kernel_sbuf_budget())
        cells = build_corner_blocks(value)                 # corner blocks only (forward's build)
        zero(this core's grad_value buffers)
        for b in range(B):
            for super_tile in plan.super_tiles(core):      # <= 128 sample rows x T blocks
                loc, w = load(sampling_locations, attention_weights)
                corners, bilinear, valid = coordinates(loc)         # fp32, as the forward
                dots = 0
                for c0 in range(0, C_h, C_t):                       # one pass unless C_h is wide
                    g = grad_output rows[:, c0:c0 + C_t]
                    if grad_sampling_locations or grad_attention_weights:
                        v = gather(value[b, ..., c0:c0 + C_t], corners)  # (rows, 4 * N_p, C_t)
                        #   (corner blocks: gather(cells[b], cell of each sample), 4 * C_h each)
                        dots += sum_c(v * g)                        # fp32, per corner
                    if grad_value:
                        scatter_add(buffers[k(partition)][..., c0:c0 + C_t], corners,
                                    w * bilinear * g)
                if grad_sampling_locations or grad_attention_weights:
                    grad_w = sum_corners(bilinear * dots)
                    grad_loc = w * map_scale * sum_corners(d_bilinear/d_pixel * dots)
                    store(grad_w, grad_loc)
        core_barrier(buffers)                                # LNC=2 only
        grad_value = cast(sum over k and cores of buffers[my row band], value.dtype)
    """
    problem = validate_msda_args(value, spatial_shapes, level_start_index, sampling_locations,
                                 attention_weights, value_layout, sampling_locations_layout, align_corners,
                                 padding_mode, grad_output=grad_output, padding_modes=KERNEL_PADDING_MODES)
    lnc, core = core_info()
    vdt = dtype_name(value.dtype)
    buffers_per_core = None
    if grad_value_buffers_in != None and len(grad_value_buffers_in.shape) == 4:  # noqa: E711
        buffers_per_core = max(1, grad_value_buffers_in.shape[1] // lnc)
    cfg = plan_backward(
        problem, vdt, lnc, gather_method, max_gather_indices_per_indirect, max_scatter_indices_per_indirect,
        num_scatter_buffers, bool(compute_grad_value), bool(compute_grad_sampling_locations),
        bool(compute_grad_attention_weights), kernel_sbuf_budget(), buffers_per_core, bool(strided_pairs),
        gather_layout)
    _check_reuse(cfg, value, num_scatter_buffers, iota_k_scale_in, grad_value_buffers_in,
                 prev_reduced_grad_value, dump_grad_value_buffers, dump_reduced_grad_value)
    kernel = _BackwardKernel(cfg, core, value, grad_output, sampling_locations, attention_weights,
                             grad_value_buffers_in)
    return kernel.run(iota_k_scale_in, grad_value_buffers_in, prev_reduced_grad_value,
                      dump_iota_k_scale, dump_grad_value_buffers, dump_reduced_grad_value)


class _BackwardKernel:
    """Instruction emission for one program (logical core).

    All state (views of the inputs, outputs, on-chip tiles, HBM buffer sets) is created here
    in ``__init__``; the methods only emit instructions. The corner gathers and dot products
    (``backward_gather``) and the grad_value scatter (``backward_scatter``) are helpers that
    keep their own round-robin counters.
    """

    def __init__(self, cfg, core, value, grad_output, locations, attention, buffers_in):
        self.cfg, self.core = cfg, core
        p = self.p = cfg.problem
        self.vdt = value.dtype
        self.grad_flat = grad_output.reshape((p.batch * p.num_queries * p.num_heads * p.head_dim,))
        rows = p.batch * p.num_queries * cfg.groups
        if p.sampling_locations_layout == "BQHLP2":
            self.loc2d = locations.reshape((rows, p.num_points * 2))
        else:
            self.loc2d = locations.reshape((rows * 2, p.num_points))
        self.attn2d = attention.reshape((rows, p.num_points))
        self.want_gsl = cfg.compute_grad_sampling_locations
        self.want_gaw = cfg.compute_grad_attention_weights
        self.grad_value = self.gsl_out = self.gaw_out = None
        if cfg.compute_grad_value:
            self.grad_value = nl.ndarray(p.value_shape, dtype=self.vdt, buffer=nl.shared_hbm, name="grad_value")
        if self.want_gsl:
            self.gsl_out = nl.ndarray(p.sampling_locations_shape, dtype=nl.float32, buffer=nl.shared_hbm,
                                      name="grad_sampling_locations")
        if self.want_gaw:
            self.gaw_out = nl.ndarray(p.attention_weights_shape, dtype=self.vdt, buffer=nl.shared_hbm,
                                      name="grad_attention_weights")
        self.t = allocate_tiles(cfg, self.vdt)
        self.buffer_sets = []
        if cfg.compute_grad_value:
            rows_total = p.batch * cfg.total_buffers * cfg.rows_per_batch
            if buffers_in != None:  # noqa: E711
                self.buffer_sets = [buffers_in.reshape((rows_total, p.head_dim))]
            else:
                self.buffer_sets = [nl.ndarray((rows_total, p.head_dim), dtype=nl.float32,
                                               buffer=nl.shared_hbm, name=f"grad_value_buffers_{s}")
                                    for s in range(cfg.scatter_sets)]
        self.live = LiveRows(cfg, self.t, core)
        self.value = value
        self.gather = CornerGather(cfg, self.t, value.reshape((p.batch * cfg.rows_per_batch, p.head_dim)),
                                   self.live)
        self.scatter = GradValueScatter(cfg, self.t, core, self.buffer_sets, self.live)

    def run(self, iota_in, buffers_in, prev_reduced, dump_iota, dump_buffers, dump_reduced):
        cfg, p = self.cfg, self.p
        t = self.t
        smp.build_partition_constants(cfg, t)
        if iota_in != None:  # noqa: E711
            nisa.dma_copy(dst=t.kscale, src=iota_in)
            nisa.tensor_copy(dst=t.kscale_f, src=t.kscale)
        else:
            smp.build_kscale(cfg, t)
        if t.gidx != None:  # noqa: E711
            nisa.memset(dst=t.gidx, value=0)
        for sidx in (t.sidx, t.sidx_alt):  # rows beyond a partial block are read, then skipped
            if sidx != None:  # noqa: E711
                nisa.memset(dst=sidx, value=0)
        self.live.build()
        if cfg.corner_blocks:  # the forward's scratch and build (one barrier at LNC 2)
            cells2d = build_corner_blocks(self.value, cfg, self.core)
            self.gather.use_corner_blocks(cells2d, scratch_rows_per_batch(p))

        buffer_sets = self.buffer_sets
        if cfg.compute_grad_value and buffers_in == None:  # noqa: E711
            bufs.zero_own_buffers(cfg, buffer_sets, self.core, t.red)

        tiles = [(b, q0, blocks, parts) for b in range(p.batch) for q0, blocks, parts in cfg.super_tiles(self.core)]
        if cfg.pipelined:
            self._pipelined(tiles)
        else:
            for b, q0, blocks, parts in tiles:
                self._super_tile(b, q0, blocks, parts)

        results = [x for x in (self.grad_value, self.gsl_out, self.gaw_out) if x != None]  # noqa: E711
        reduced_out = None
        if dump_reduced:
            reduced_out = nl.ndarray(p.value_shape, dtype=nl.float32, buffer=nl.shared_hbm,
                                     name="reduced_grad_value")
        if cfg.compute_grad_value:
            # Each core reads every core's buffers of every set below: one barrier per set.
            for buffer_set in buffer_sets:
                core_barrier(buffer_set, cfg.lnc)
            bufs.reduce_and_store(cfg, buffer_sets, self.core, t, self.grad_value, prev_reduced, reduced_out)
        if dump_iota:
            iota_out = nl.ndarray(cfg.iota_k_scale_shape, dtype=nl.int32, buffer=nl.shared_hbm, name="iota_k_scale")
            nisa.dma_copy(dst=iota_out, src=t.kscale)
            results.append(iota_out)
        if dump_buffers:
            results.append(buffers_in if buffers_in != None else buffer_sets[0].reshape(cfg.buffer_shape))  # noqa: E711
        if dump_reduced:
            results.append(reduced_out)
        return tuple(results)

    # ------------------------------------------------------------------ per super-tile
    def _super_tile(self, b: int, q0: int, blocks: int, n: int) -> None:
        cfg, p, t = self.cfg, self.p, self.t
        f = blocks * p.num_points
        row0 = (b * p.num_queries + q0) * cfg.groups
        self._load_params(b, q0, blocks, n)
        channel_tiles = cfg.channel_tiles
        self._load_grad(b, q0, n, blocks, *channel_tiles[0])
        if cfg.needs_gather:
            self._grad_scales(b, q0, n, blocks)
        smp.sample_terms(cfg, t, n, f, cfg.needs_gather, self.want_gsl)
        scatter_terms = None
        for i, (c0, width) in enumerate(channel_tiles):
            if i:
                self._load_grad(b, q0, n, blocks, c0, width)
            if cfg.needs_gather:
                self.gather.dots(b, n, blocks, c0, width, first=i == 0)
                if i == len(channel_tiles) - 1:
                    self.gather.finish(n, f)
                    self._sample_gradients(b, row0, n, f, blocks)
            if cfg.compute_grad_value:
                if scatter_terms == None:  # noqa: E711
                    scatter_terms = self.scatter.terms(n, f)
                self.scatter.tile(b, n, blocks, c0, width, *scatter_terms)

    def _pipelined(self, tiles) -> None:
        """Super-tiles (b, q0, blocks, n) with tile i + 1's loads, coordinates, indices and
        gathers emitted after tile i's gradients and scatter terms but before its scatter data
        and scatters (one channel tile, transpose gathers, unfolded scatter; plan.pipelined):
        GpSimd then issues tile i + 1's gathers before tile i's scatters, so the Vector engine's
        dot products of tile i + 1 run while GpSimd generates tile i's scatter descriptors.
        Tile i + 1 loads into the ``*_alt`` copies of grad and vbits (and its terms go to the
        other sidx), which tile i's scatter still reads; the order of the scatters, and so
        grad_value, is that of :meth:`_super_tile`."""
        p, t = self.p, self.t
        ((c0, width),) = self.cfg.channel_tiles
        if not tiles:  # a core with no queries (LNC 2, tiny N_q)
            return
        issued = self._prepare(*tiles[0])
        for i, (b, q0, blocks, n) in enumerate(tiles):
            f = blocks * p.num_points
            row0 = (b * p.num_queries + q0) * self.cfg.groups
            self.gather.dots(b, n, blocks, c0, width, first=True, issued=issued)
            self.gather.finish(n, f)
            self._sample_gradients(b, row0, n, f, blocks)
            coef, bits = self.scatter.terms(n, f)
            grad, sidx = t.grad, t.sidx
            if i + 1 < len(tiles):
                t.grad, t.grad_alt = t.grad_alt, t.grad
                t.vbits, t.vbits_alt = t.vbits_alt, t.vbits
                issued = self._prepare(*tiles[i + 1])
            self.scatter.tile(b, n, blocks, c0, width, coef, bits, grad, sidx)
            t.sidx, t.sidx_alt = t.sidx_alt, t.sidx

    def _prepare(self, b: int, q0: int, blocks: int, n: int) -> list:
        """Loads, row scales, bilinear terms and gather indices of one super-tile, then its
        gathers (one list of issued transposes per block)."""
        p, t = self.p, self.t
        f = blocks * p.num_points
        self._load_params(b, q0, blocks, n)
        ((c0, width),) = self.cfg.channel_tiles
        self._load_grad(b, q0, n, blocks, c0, width)
        self._grad_scales(b, q0, n, blocks)
        smp.sample_terms(self.cfg, t, n, f, True, self.want_gsl)
        self.gather.prepare_indices(n, f)
        return [self.gather.issue(b, blk, c0, width) for blk in range(blocks)]

    def _load_params(self, b: int, q0: int, blocks: int, n: int) -> None:
        """loc and attn of the super-tile's sample rows."""
        cfg, p, t = self.cfg, self.p, self.t
        f = blocks * p.num_points
        row0 = (b * p.num_queries + q0) * cfg.groups
        rpb = cfg.partitions_per_block
        if p.sampling_locations_layout == "BQHLP2":
            nisa.dma_copy(dst=t.loc[0:n, 0:f, :], src=_rows_ap(self.loc2d, row0, n, blocks, rpb))
        else:
            plane = p.num_queries * cfg.groups
            for c in range(2):
                prow = (b * 2 + c) * plane + q0 * cfg.groups
                nisa.dma_copy(dst=t.loc[0:n, 0:f, c], src=_rows_ap(self.loc2d, prow, n, blocks, rpb))
        nisa.dma_copy(dst=t.attn[0:n, 0:f], src=_rows_ap(self.attn2d, row0, n, blocks, rpb))

    def _load_grad(self, b: int, q0: int, n: int, blocks: int, c0: int, width: int) -> None:
        """grad[j, blk, 0:width] = grad_output channels [c0, c0 + width) of partition j's (q, h)."""
        cfg, p, t = self.cfg, self.p, self.t
        n_h, c_h, n_l = p.num_heads, p.head_dim, p.num_levels
        queries = n // cfg.groups
        grad_src = self.grad_flat.ap(
            [[n_h * c_h, queries], [c_h, n_h], [0, n_l], [cfg.queries_per_block * n_h * c_h, blocks], [1, width]],
            offset=(b * p.num_queries + q0) * n_h * c_h + c0)
        nisa.dma_copy(dst=t.grad[0:n, 0:blocks, 0:width], src=grad_src)

    def _grad_scales(self, b: int, q0: int, n: int, blocks: int) -> None:
        """grad_scale[j] = (2^-k, 2^k): the power of two that brings partition j's largest
        |grad_output| (over every channel tile) into [1, 4) (k = 0 below 2; k <= 126). The dots
        use the scaled rows and the sample gradients are scaled back last, so grad_output near
        the fp32 maximum overflows once, to the infinity of the right sign, instead of giving
        inf - inf = NaN in the corner sum. Exact: a power-of-two scale only moves exponents.
        Built from exponent bits: 2^-k has bits 0x7F000000 - E(max|g|), clamped to
        [2^-126, 1]; 2^k has 0x7F000000 - bits(2^-k) (inf/NaN rows take 2^-126 and stay
        inf/NaN). The bitvec op runs on int32 views; the int32 subtract / min / max are exact
        even if the engine computes them in float32, as every value is a multiple of 2^23 below
        2^31 (tensor_scalar: one op kind per instruction, bitvec ops on integer dtypes,
        https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.tensor_scalar.html).
        Expects channel tile 0 in ``grad`` and leaves it there; with several channel tiles it
        loads each in turn (column 2 keeps the running maximum) and tile 0 again at the end."""
        t = self.t
        scale = t.grad_scale[0:n, :]
        bits = crd.int32_bits(scale)
        tiles = self.cfg.channel_tiles
        for i, (c0, width) in enumerate(tiles):
            if i:
                self._load_grad(b, q0, n, blocks, c0, width)
            grad = t.grad[0:n, 0:blocks, 0:width]
            nisa.tensor_reduce(dst=scale[:, 0:1], op=nl.maximum, data=grad, axis=(1, 2))
            nisa.tensor_reduce(dst=scale[:, 1:2], op=nl.minimum, data=grad, axis=(1, 2), negate=True)
            if i == 0:
                nisa.tensor_reduce(dst=scale[:, 2:3], op=nl.maximum, data=scale[:, 0:2], axis=1)
            else:
                nisa.tensor_reduce(dst=scale[:, 0:1], op=nl.maximum, data=scale[:, 0:2], axis=1)
                nisa.tensor_tensor(dst=scale[:, 2:3], data1=scale[:, 2:3], data2=scale[:, 0:1],
                                   op=nl.maximum)
        if len(tiles) > 1:
            self._load_grad(b, q0, n, blocks, *tiles[0])
        nisa.tensor_scalar(dst=bits[:, 0:1], data=bits[:, 2:3], op0=nl.bitwise_and, operand0=_EXPONENT_BITS)
        # arithmetic operands are float32 immediates (tensor_scalar: "must be float32"); every
        # value is a multiple of 2^23 below 2^31, exact in fp32
        nisa.tensor_scalar(dst=bits[:, 0:1], data=bits[:, 0:1], op0=nl.subtract, operand0=float(_TWO_POW_127_BITS),
                           reverse0=True, op1=nl.maximum, operand1=float(_TWO_POW_MINUS_126_BITS))
        nisa.tensor_scalar(dst=bits[:, 0:1], data=bits[:, 0:1], op0=nl.minimum, operand0=float(_ONE_BITS))
        nisa.tensor_scalar(dst=bits[:, 1:2], data=bits[:, 0:1], op0=nl.subtract, operand0=float(_TWO_POW_127_BITS),
                           reverse0=True)

    def _sample_gradients(self, b: int, row0: int, n: int, f: int, blocks: int) -> None:
        cfg, p, t = self.cfg, self.p, self.t
        rpb = cfg.partitions_per_block
        dc = t.dc[0:n, 0:f, :]
        prod = t.prod4[0:n, 0:f, :]
        unscale = t.grad_scale[0:n, 1:2]  # 2^k: last, after every finite factor
        if self.want_gaw:
            gaw = t.gaw[0:n, 0:f]
            nisa.tensor_tensor(dst=prod, data1=t.weights[0:n, 0:f, :], data2=dc, op=nl.multiply)
            nisa.tensor_reduce(dst=gaw, op=nl.add, data=prod, axis=2)
            nisa.tensor_scalar(dst=gaw, data=gaw, op0=nl.multiply, operand0=unscale)
            out2d = self.gaw_out.reshape((p.batch * p.num_queries * cfg.groups, p.num_points))
            src = gaw
            if str(self.vdt) != str(nl.float32):
                src = t.gaw_out[0:n, 0:f]
                nisa.tensor_copy(dst=src, src=gaw)
            nisa.dma_copy(dst=_rows_ap(out2d, row0, n, blocks, rpb), src=src)
        if self.want_gsl:
            gsl = t.gsl[0:n, 0:f, :]
            tmp = t.xy_tmp[0:n, :, 0:f]
            for axis, dw in ((0, t.dwx), (1, t.dwy)):
                nisa.tensor_tensor(dst=prod, data1=dw[0:n, 0:f, :], data2=dc, op=nl.multiply)
                nisa.tensor_reduce(dst=tmp[:, axis, :], op=nl.add, data=prod, axis=2)
                nisa.tensor_tensor(dst=gsl[:, :, axis], data1=tmp[:, axis, :],
                                   data2=t.scale_a[0:n, axis, 0:f], op=nl.multiply)
            nisa.tensor_scalar(dst=gsl, data=gsl, op0=nl.multiply, operand0=unscale)
            rows = p.batch * p.num_queries * cfg.groups
            if p.sampling_locations_layout == "BQHLP2":
                out2d = self.gsl_out.reshape((rows, p.num_points * 2))
                nisa.dma_copy(dst=_rows_ap(out2d, row0, n, blocks, rpb), src=gsl)
            else:
                out2d = self.gsl_out.reshape((rows * 2, p.num_points))
                plane = p.num_queries * cfg.groups
                q_row = row0 - b * plane
                for c in range(2):
                    prow = (b * 2 + c) * plane + q_row
                    nisa.dma_copy(dst=_rows_ap(out2d, prow, n, blocks, rpb), src=gsl[:, :, c])



def _check_arguments(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                     attention_weights, value_layout="BLNC", sampling_locations_layout="BQHLP2",
                     align_corners=False, padding_mode="zeros", **tuning):
    """The kernel's argument validation on the caller's arrays (explain_argument_errors)."""
    validate_msda_args(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                       value_layout, sampling_locations_layout, align_corners, padding_mode,
                       grad_output=grad_output, padding_modes=KERNEL_PADDING_MODES)


explain_argument_errors(ms_deformable_attention_bwd, _check_arguments)
