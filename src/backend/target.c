#include "target.h"

#include "backend.h"
#include "core/dtype.h"

struct exec_target target_running(void)
{
    return (struct exec_target){false, backend_is_device() != 0, backend_act_dtype()};
}

struct exec_target target_cuda(enum dtype act) { return (struct exec_target){true, true, act}; }

size_t target_attention_saved(const struct exec_target *t, int B, int T, int NH)
{
    return t->as_cuda ? BACKEND_CUDA_ATTENTION_SAVED(B, T, NH) : backend_attention_saved(B, T, NH);
}

size_t target_attention_scratch(const struct exec_target *t, int T, int NH)
{
    return t->as_cuda ? BACKEND_CUDA_ATTENTION_SCRATCH(T, NH) : backend_attention_scratch(T, NH);
}

size_t target_norm_scratch(const struct exec_target *t, int C) { return t->as_cuda ? 0 : backend_layernorm_scratch(C); }

size_t target_library_workspace(const struct exec_target *t)
{
    return t->as_cuda ? BACKEND_CUDA_LIBRARY_WORKSPACE : backend_library_workspace();
}

size_t target_act_bytes(const struct exec_target *t, size_t n) { return arena_round(n * (size_t)dtype_size(t->act)); }

enum mem_space target_space(const struct exec_target *t, const struct config *cfg, enum buf_class c)
{
    switch (c) {
    case BUF_MASTER:
    case BUF_ADAM_M:
    case BUF_ADAM_V:
    case BUF_FP32_GRADS:
        /* offload_optimizer "nvme": the fp32 gradients stay in device memory, as without offload; the step
         * stages them unit by unit (zero_optim.c) */
        if (!cfg->zero.offload_optimizer || (c == BUF_FP32_GRADS && cfg->zero.offload_optimizer_nvme))
            return SPACE_DEVICE;
        return cfg->zero.offload_pin_memory || t->device ? SPACE_PINNED : SPACE_HOST;
    case BUF_STAGING: return SPACE_PINNED;
    case BUF_PARAMS:
        if (!cfg->zero.offload_param)
            return SPACE_DEVICE;
        return cfg->zero.offload_param_pin_memory || t->device ? SPACE_PINNED : SPACE_HOST;
    case BUF_ACT_CKPT: return cfg->act_ckpt.enabled && cfg->act_ckpt.cpu_checkpointing ? SPACE_PINNED : SPACE_DEVICE;
    default: return SPACE_DEVICE;
    }
}
