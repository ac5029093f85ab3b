// Golden-vector harness for duet-quant: runs ggml's own quantizers (libggml-base) on raw
// little-endian f32 files and writes the bytes they produce. See README.md in this folder;
// make_golden.py drives it. This file is ours; nothing from ggml is copied into it.
//
//   harness quant   TYPE N_PER_ROW IN.f32 OUT.bin [IMATRIX.f32]
//   harness dequant TYPE IN.bin OUT.f32
//
// TYPE: q4_0 q4_1 q5_0 q5_1 q8_0 q8_1 q4_K q5_K q6_K q8_K f16 bf16.
//
// quant without IMATRIX calls the reference path (quantize_row_<t>_ref over all rows, or
// ggml_fp32_to_fp16_row / ggml_fp32_to_bf16_row_ref) and, for the weight types, checks that
// quantize_<t>(…, NULL) and ggml_quantize_chunk(…, NULL) (what llama-quantize calls) give the
// same bytes. With IMATRIX (one f32 per column) it calls quantize_<t>(src, dst, nrow,
// n_per_row, imatrix) and checks ggml_quantize_chunk(…, imatrix) agrees.
//
// Each quantization runs twice, into a buffer pre-filled with 0x00 and one pre-filled with
// 0xA5; bytes that differ were never written by ggml (Q8_K leaves bsums of an all-zero
// block untouched). The 0x00-filled result is written out and the count is reported on
// stderr as "unwritten=N" so the generator can record it.

#include "ggml.h"
#include "ggml-quants.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*ref_fn)(const float *, void *, int64_t);
typedef size_t (*imat_fn)(const float *, void *, int64_t, int64_t, const float *);
typedef void (*deq_fn)(const void *, float *, int64_t);

struct qtype {
    const char *name;
    enum ggml_type type;
    ref_fn ref;    // reference quantizer over k = nrow * n_per_row values
    imat_fn imat;  // quantize_<t>(src, dst, nrow, n_per_row, imatrix), NULL if none
    deq_fn deq;    // dequantize_row_<t> / f16, bf16 → f32, NULL if ggml has none
    int weight;    // a type llama-quantize writes (goes through ggml_quantize_chunk)
};

#define R(f) ((ref_fn)(void (*)(void))(f))
#define D(f) ((deq_fn)(void (*)(void))(f))

static const struct qtype TYPES[] = {
    {"q4_0", GGML_TYPE_Q4_0, R(quantize_row_q4_0_ref), quantize_q4_0, D(dequantize_row_q4_0), 1},
    {"q4_1", GGML_TYPE_Q4_1, R(quantize_row_q4_1_ref), quantize_q4_1, D(dequantize_row_q4_1), 1},
    {"q5_0", GGML_TYPE_Q5_0, R(quantize_row_q5_0_ref), quantize_q5_0, D(dequantize_row_q5_0), 1},
    {"q5_1", GGML_TYPE_Q5_1, R(quantize_row_q5_1_ref), quantize_q5_1, D(dequantize_row_q5_1), 1},
    {"q8_0", GGML_TYPE_Q8_0, R(quantize_row_q8_0_ref), quantize_q8_0, D(dequantize_row_q8_0), 1},
    {"q8_1", GGML_TYPE_Q8_1, R(quantize_row_q8_1_ref), NULL, NULL, 0},
    {"q4_K", GGML_TYPE_Q4_K, R(quantize_row_q4_K_ref), quantize_q4_K, D(dequantize_row_q4_K), 1},
    {"q5_K", GGML_TYPE_Q5_K, R(quantize_row_q5_K_ref), quantize_q5_K, D(dequantize_row_q5_K), 1},
    {"q6_K", GGML_TYPE_Q6_K, R(quantize_row_q6_K_ref), quantize_q6_K, D(dequantize_row_q6_K), 1},
    {"q8_K", GGML_TYPE_Q8_K, R(quantize_row_q8_K_ref), NULL, D(dequantize_row_q8_K), 0},
    {"f16", GGML_TYPE_F16, R(ggml_fp32_to_fp16_row), NULL, D(ggml_fp16_to_fp32_row), 1},
    {"bf16", GGML_TYPE_BF16, R(ggml_fp32_to_bf16_row_ref), NULL, D(ggml_bf16_to_fp32_row), 1},
};

static void die(const char *msg, const char *arg) {
    fprintf(stderr, "harness: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

static const struct qtype *find_type(const char *name) {
    for (size_t i = 0; i < sizeof(TYPES) / sizeof(TYPES[0]); i++) {
        if (strcmp(TYPES[i].name, name) == 0) return &TYPES[i];
    }
    die("unknown type", name);
    return NULL;
}

static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    if (fseek(f, 0, SEEK_END) != 0) die("cannot seek", path);
    long n = ftell(f);
    if (n < 0) die("cannot tell", path);
    rewind(f);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf) die("out of memory", NULL);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) die("short read", path);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_file(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot create", path);
    if (len > 0 && fwrite(buf, 1, len, f) != len) die("short write", path);
    if (fclose(f) != 0) die("cannot close", path);
}

// One quantization of the whole input, by the path `how` names, into dst.
enum how { REF, QUANTIZE_FN, CHUNK };

static void run(const struct qtype *t, enum how how, const float *x, void *dst, int64_t nrow, int64_t n_per_row,
                const float *imatrix) {
    switch (how) {
        case REF:
            t->ref(x, dst, nrow * n_per_row);
            break;
        case QUANTIZE_FN:
            t->imat(x, dst, nrow, n_per_row, imatrix);
            break;
        case CHUNK:
            ggml_quantize_chunk(t->type, x, dst, 0, nrow, n_per_row, imatrix);
            break;
    }
}

// Runs `how` into a zero-filled and an 0xA5-filled buffer; returns the zero-filled one and
// the number of bytes that differ between the two (bytes ggml never wrote).
static uint8_t *run_twice(const struct qtype *t, enum how how, const float *x, size_t out_len, int64_t nrow,
                          int64_t n_per_row, const float *imatrix, size_t *unwritten) {
    uint8_t *a = malloc(out_len ? out_len : 1);
    uint8_t *b = malloc(out_len ? out_len : 1);
    if (!a || !b) die("out of memory", NULL);
    memset(a, 0x00, out_len);
    memset(b, 0xA5, out_len);
    run(t, how, x, a, nrow, n_per_row, imatrix);
    run(t, how, x, b, nrow, n_per_row, imatrix);
    size_t n = 0;
    for (size_t i = 0; i < out_len; i++) n += a[i] != b[i];
    free(b);
    *unwritten = n;
    return a;
}

static int cmd_quant(int argc, char **argv) {
    if (argc != 6 && argc != 7) die("usage: harness quant TYPE N_PER_ROW IN.f32 OUT.bin [IMATRIX.f32]", NULL);
    const struct qtype *t = find_type(argv[2]);
    const int64_t n_per_row = strtoll(argv[3], NULL, 10);
    const int64_t blck = ggml_blck_size(t->type);
    if (n_per_row <= 0 || n_per_row % blck != 0) die("N_PER_ROW is not a whole number of blocks", argv[3]);

    size_t in_len;
    float *x = read_file(argv[4], &in_len);
    if (in_len % (sizeof(float) * (size_t)n_per_row) != 0) die("input is not whole rows of f32", argv[4]);
    const int64_t nrow = (int64_t)(in_len / sizeof(float)) / n_per_row;
    const size_t out_len = (size_t)nrow * ggml_row_size(t->type, n_per_row);

    float *imatrix = NULL;
    if (argc == 7) {
        size_t im_len;
        imatrix = read_file(argv[6], &im_len);
        if (im_len != sizeof(float) * (size_t)n_per_row) die("imatrix must hold N_PER_ROW f32", argv[6]);
        if (!t->imat) die("this type has no importance-matrix quantizer", t->name);
    }

    size_t unwritten = 0, other_unwritten = 0;
    uint8_t *out;
    if (!imatrix) {
        out = run_twice(t, REF, x, out_len, nrow, n_per_row, NULL, &unwritten);
        // The other entry points must agree with the reference path when given no imatrix.
        if (t->imat) {
            uint8_t *o = run_twice(t, QUANTIZE_FN, x, out_len, nrow, n_per_row, NULL, &other_unwritten);
            if (memcmp(o, out, out_len) != 0) die("quantize_<t>(…, NULL) differs from quantize_row_<t>_ref", t->name);
            free(o);
        }
        if (t->weight) {
            uint8_t *o = run_twice(t, CHUNK, x, out_len, nrow, n_per_row, NULL, &other_unwritten);
            if (memcmp(o, out, out_len) != 0) die("ggml_quantize_chunk(…, NULL) differs from the reference path", t->name);
            free(o);
        }
    } else {
        out = run_twice(t, QUANTIZE_FN, x, out_len, nrow, n_per_row, imatrix, &unwritten);
        uint8_t *o = run_twice(t, CHUNK, x, out_len, nrow, n_per_row, imatrix, &other_unwritten);
        if (memcmp(o, out, out_len) != 0) die("ggml_quantize_chunk(…, imatrix) differs from quantize_<t>(…, imatrix)", t->name);
        free(o);
    }
    write_file(argv[5], out, out_len);
    fprintf(stderr, "unwritten=%zu\n", unwritten);
    free(out);
    free(x);
    free(imatrix);
    return 0;
}

static int cmd_dequant(int argc, char **argv) {
    if (argc != 5) die("usage: harness dequant TYPE IN.bin OUT.f32", NULL);
    const struct qtype *t = find_type(argv[2]);
    if (!t->deq) die("ggml has no dequantizer for", t->name);
    size_t in_len;
    void *q = read_file(argv[3], &in_len);
    const size_t tsize = ggml_type_size(t->type);
    const int64_t blck = ggml_blck_size(t->type);
    if (in_len % tsize != 0) die("input is not whole blocks", argv[3]);
    const int64_t n = (int64_t)(in_len / tsize) * blck;
    float *y = calloc((size_t)n ? (size_t)n : 1, sizeof(float));
    if (!y) die("out of memory", NULL);
    t->deq(q, y, n);
    write_file(argv[4], y, (size_t)n * sizeof(float));
    free(y);
    free(q);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "quant") == 0) return cmd_quant(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "dequant") == 0) return cmd_dequant(argc, argv);
    fprintf(stderr,
            "usage: harness quant TYPE N_PER_ROW IN.f32 OUT.bin [IMATRIX.f32]\n"
            "       harness dequant TYPE IN.bin OUT.f32\n");
    return 2;
}
