// engine/model/layer_tensors_int.h - what tensors a layer of a model has:
// the loader's table (engine/model/layer_tensors.c). Private to
// engine/model/ (model_load.c).
//
// Every stored tensor of a layer is named once, with its GGUF and its
// Hugging Face name and its shape from the config; pg_layer_tensors lists
// those layer l of a config has, in the order the loader makes them (the
// parts of a fused weight next to each other), so the loader, the planner
// and the progress bar walk one list. A mixture-of-experts layer lists its
// router and then, expert by expert, gate, up and down: Hugging Face
// stores one tensor per expert, GGUF one tensor of all the layer's experts
// ([n_experts][rows][cols], `*_exps`), of which an expert is a block of
// rows.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/model/model.h"

// A dimension of a stored tensor, from the config.
typedef enum { DIM_ONE, DIM_HIDDEN, DIM_Q, DIM_KV, DIM_FFN, DIM_HEAD, DIM_VOCAB, DIM_EXPERTS, DIM_MOE_FFN } pg_lt_dim;

// The weight of pg_model_layer a stored tensor is (part of).
typedef enum {
    F_ATTN_NORM, F_QKV, F_QKV_BIAS, F_Q_NORM, F_K_NORM, F_O, F_FFN_NORM, F_GATE_UP, F_DOWN,
    F_ROUTER, F_EXP_GATE_UP, F_EXP_DOWN, F_POST_ATTN_NORM, F_POST_FFN_NORM,
    F_COUNT
} pg_lt_field;

typedef struct {
    pg_lt_field field;
    int part;             // its part of a fused weight (Q, K, V; gate, up)
    int32_t expert;       // the expert (F_EXP_*), else -1
    char name[160];       // the stored tensor's name in this source
    int64_t rows, cols;   // the tensor's shape (an expert's of a stacked GGUF tensor)
    int64_t stored_rows;  // rows of the stored tensor (n_experts * rows when stacked)
    int64_t row0;         // its first row there (stacked: expert * rows; else 0)
    pg_lt_dim rows_dim, cols_dim; // what tensor parallelism splits (pg_lt_shard_range)
    int unpermute;        // GGUF "llama": head count whose rows to re-order (1 = q, 2 = k)
    bool vector;          // a norm or a bias (1 x n)
    bool norm;            // an RMSNorm weight (pg_model_config.norm_add applies)
} pg_layer_tensor;

// The most tensors a layer of c has (the capacity pg_layer_tensors wants).
int pg_layer_tensors_max(const pg_model_config *c);
// The tensors of layer l in load order, names for a GGUF (gguf true) or a
// Hugging Face source; returns how many. The experts listed are those shard
// sh holds ([exp0, exp0 + n_exp): all but under expert parallelism); sh
// NULL: every expert.
int pg_layer_tensors(const pg_model_config *c, const pg_model_shard *sh, bool gguf, int32_t l,
                     pg_layer_tensor *out);

// The size of a dimension.
int64_t pg_lt_dim_size(const pg_model_config *c, pg_lt_dim d);
// This rank's range [*lo, *lo + *n) of a dimension; false when the
// dimension is not split (hidden, head_dim, experts, one; the experts'
// width under expert parallelism).
bool pg_lt_shard_range(const pg_model_config *c, const pg_model_shard *sh, pg_lt_dim d, int64_t *lo, int64_t *n);

// Where layer L keeps a tensor's (fused) weight.
pg_bweight **pg_lt_field_ptr(pg_model_layer *L, pg_lt_field f, int32_t expert);
