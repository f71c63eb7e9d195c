/* ei_nb.jsonl_scan: a validating JSON Lines scanner. It never reports an error itself: a line is either fully
   understood and valid (RFC 8259 grammar, well-formed UTF-8, no duplicate key in any object at any depth, the
   schema's top-level fields of the right type class, finite numbers) or the scan stops and says "deferred",
   and the caller reads the whole file with its exact reader instead, which gives the precise error.
   Anything unusual defers: a backslash in a key or in an output string, deep nesting, very long numbers,
   integers outside int64, a top-level value that is not an object, a missing required field. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { T_STR = 1, T_INT = 2, T_FLOAT = 4, T_BOOL = 8, T_NULL = 16, T_LIST = 32, T_OBJ = 64 };
enum { F_REQUIRED = 1, F_OUT_STR = 2, F_OUT_INT = 4, F_NONNEG = 8, F_BY_END = 16, F_OUT_SPAN = 32 };
#define F_OUT (F_OUT_STR | F_OUT_INT | F_OUT_SPAN)
#define MAX_FIELDS 32
#define MAX_DEPTH 256          /* Python's json raises RecursionError far deeper; deeper lines defer */
#define MAX_KEYS 256           /* keys of one object compared pairwise; more defer */
#define MAX_NUMBER 1000        /* Python refuses integers of more than 4300 digits; longer numbers defer */
#define KPAT 48                /* top-level keys up to this long (with quotes) are remembered by position */
#define MAX_VALUES 8           /* distinct values of a counted field (a verdict has 5): more, and the caller counts by columns */

typedef struct { const uint8_t *p; int32_t n; } span_t;

typedef struct {             /* interned byte strings of one output column: an arena and an open-addressing index */
  uint8_t *arena; int64_t arena_len, arena_cap;
  int64_t *off; int32_t *len; int64_t n, cap;
  int32_t *slots; int64_t nslots;
  int32_t last, last2;       /* the ids of the two latest values: consecutive rows often repeat them */
} intern_t;

typedef struct {             /* counting mode: rows per (key, value), instead of columns of rows */
  int on, key, idx, val;     /* the fields: the key (a str id), its increasing index (an int), the counted value (a str id) */
  int32_t row_key, row_val; int64_t row_idx;   /* the outputs of the line being scanned */
  int64_t *cnt, *first, *last; int64_t n, cap;   /* per key id: MAX_VALUES counts, its first and its latest index */
} count_t;

typedef struct {
  int nfields;
  const uint8_t *name[MAX_FIELDS]; int32_t name_len[MAX_FIELDS]; int32_t types[MAX_FIELDS]; int32_t flags[MAX_FIELDS];
  intern_t intern[MAX_FIELDS];
  uint8_t *names;            /* our copy of the field names */
  span_t *keys; int64_t keys_cap;
  int8_t order[MAX_FIELDS + 1];   /* the schema field at each top-level key position of the previous line: the likely one */
  uint8_t kpat[MAX_FIELDS][KPAT];  /* and that key's raw bytes, quotes included: equal bytes are the same valid key */
  int32_t kpat_len[MAX_FIELDS]; int32_t kpat_field[MAX_FIELDS];
  uint32_t must;             /* the fields every line must have: required or output */
  uint8_t *scratch; int64_t scratch_cap;
  const uint8_t *buf; int64_t base;   /* the buffer being scanned and its offset in the file (for F_OUT_SPAN) */
  count_t count;
} ctx_t;

/* Whether n bytes at a and b are equal: short keys and names are compared inline, not through a libc call. */
static int same_bytes(const uint8_t *a, const uint8_t *b, int32_t n);
static inline int same_bytes(const uint8_t *a, const uint8_t *b, int32_t n) {
  if (n >= 8 && n <= 16) {
    uint64_t x, y, u, v;
    memcpy(&x, a, 8); memcpy(&y, b, 8); memcpy(&u, a + n - 8, 8); memcpy(&v, b + n - 8, 8);
    return x == y && u == v;
  }
  if (n > 16 && n <= 32) return same_bytes(a, b, 16) && same_bytes(a + n - 16, b + n - 16, 16);
  if (n < 8) { for (int32_t i = 0; i < n; i++) if (a[i] != b[i]) return 0; return 1; }
  return memcmp(a, b, n) == 0;
}

/* ---------------------------------------------------------------- interning */

static uint64_t hash_bytes(const uint8_t *p, int32_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (int32_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
  return h ^ (h >> 29);
}

static int intern_grow(intern_t *t) {
  int64_t ns = t->nslots ? t->nslots * 2 : 1024;
  int32_t *s = malloc(sizeof(int32_t) * ns);
  if (!s) return -1;
  memset(s, 0xff, sizeof(int32_t) * ns);
  for (int64_t i = 0; i < t->n; i++) {
    uint64_t h = hash_bytes(t->arena + t->off[i], t->len[i]) & (ns - 1);
    while (s[h] >= 0) h = (h + 1) & (ns - 1);
    s[h] = (int32_t)i;
  }
  free(t->slots); t->slots = s; t->nslots = ns;
  return 0;
}

static int32_t intern(intern_t *t, const uint8_t *p, int32_t n) {
  if (t->last >= 0 && t->len[t->last] == n && same_bytes(t->arena + t->off[t->last], p, n)) return t->last;
  if (t->last2 >= 0 && t->len[t->last2] == n && same_bytes(t->arena + t->off[t->last2], p, n)) { int32_t i = t->last2; t->last2 = t->last; return t->last = i; }
  if ((t->n + 1) * 2 > t->nslots && intern_grow(t)) return -1;
  uint64_t h = hash_bytes(p, n) & (t->nslots - 1);
  for (;;) {
    int32_t i = t->slots[h];
    if (i < 0) break;
    if (t->len[i] == n && same_bytes(t->arena + t->off[i], p, n)) { t->last2 = t->last; return t->last = i; }
    h = (h + 1) & (t->nslots - 1);
  }
  if (t->n == INT32_MAX) return -1;
  if (t->n == t->cap) {
    int64_t c = t->cap ? t->cap * 2 : 256;
    int64_t *o = realloc(t->off, sizeof(int64_t) * c); if (!o) return -1; t->off = o;
    int32_t *l = realloc(t->len, sizeof(int32_t) * c); if (!l) return -1; t->len = l;
    t->cap = c;
  }
  if (t->arena_len + n > t->arena_cap) {
    int64_t c = t->arena_cap ? t->arena_cap : 4096;
    while (c < t->arena_len + n) c *= 2;
    uint8_t *a = realloc(t->arena, c); if (!a) return -1;
    t->arena = a; t->arena_cap = c;
  }
  memcpy(t->arena + t->arena_len, p, n);
  t->off[t->n] = t->arena_len; t->len[t->n] = n; t->arena_len += n;
  t->slots[h] = (int32_t)t->n;
  t->last2 = t->last;
  return t->last = (int32_t)t->n++;
}

/* ---------------------------------------------------------------- the lexer pieces */

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static inline int is_hex(uint8_t c) { return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'f'); }
static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* One UTF-8 sequence starting at p (p[0] >= 0x80), well-formed per Unicode Table 3-7: its length, or 0. */
static inline int utf8_seq(const uint8_t *p, const uint8_t *e) {
  uint8_t c = p[0];
  if (c >= 0xC2 && c <= 0xDF) return (e - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (e - p < 3) return 0;
    uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return (p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (e - p < 4) return 0;
    uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return (p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80) ? 4 : 0;
  }
  return 0;
}

/* A string whose opening quote is at *pp: on success *pp is past the closing quote, the content is [s, s+n),
   and *esc says whether it holds a backslash escape. 0 on any grammar or UTF-8 fault. */
static inline __attribute__((always_inline)) int scan_string(const uint8_t **pp, const uint8_t *e, span_t *out, int *esc) {
  const uint8_t *p = *pp + 1, *s = p;
  *esc = 0;
  for (;;) {
    while (p + 8 <= e) {     /* eight plain ASCII bytes at a time: no quote, backslash, control or high byte */
      uint64_t x; memcpy(&x, p, 8);
      uint64_t hi = x & 0x8080808080808080ULL;
      uint64_t ctl = (x - 0x2020202020202020ULL) & ~x & 0x8080808080808080ULL;
      uint64_t q = x ^ 0x2222222222222222ULL, b = x ^ 0x5C5C5C5C5C5C5C5CULL;
      uint64_t zq = (q - 0x0101010101010101ULL) & ~q & 0x8080808080808080ULL;
      uint64_t zb = (b - 0x0101010101010101ULL) & ~b & 0x8080808080808080ULL;
      uint64_t m = hi | ctl | zq | zb;
      if (m) { p += __builtin_ctzll(m) >> 3; break; }   /* the lowest flagged byte is exact in each of these tests */
      p += 8;
    }
    if (p >= e) return 0;
    uint8_t c = *p;
    if (c == '"') break;
    if (c < 0x20) return 0;
    if (c == '\\') {
      *esc = 1;
      if (p + 1 >= e) return 0;
      uint8_t d = p[1];
      if (d == 'u') {
        if (e - p < 6 || !is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]) || !is_hex(p[5])) return 0;
        p += 6;
      } else if (d == '"' || d == '\\' || d == '/' || d == 'b' || d == 'f' || d == 'n' || d == 'r' || d == 't') p += 2;
      else return 0;
    } else if (c >= 0x80) {
      int k = utf8_seq(p, e);
      if (!k) return 0;
      p += k;
    } else p++;
  }
  out->p = s; out->n = (int32_t)(p - s);
  *pp = p + 1;
  return 1;
}

/* A number at *pp: its type class (T_INT without fraction or exponent, else T_FLOAT), 0 on a grammar fault.
   *finite is 1 only when the value surely fits a double (a conservative bound; unsure numbers defer). */
static int scan_number(const uint8_t **pp, const uint8_t *e, int *finite, int64_t *ival, int *ival_ok) {
  const uint8_t *p = *pp, *s = p;
  int neg = 0;
  if (p < e && *p == '-') { neg = 1; p++; }
  if (p >= e || !is_digit(*p)) return 0;
  const uint8_t *d0 = p;
  if (*p == '0') p++; else while (p < e && is_digit(*p)) p++;
  int64_t int_digits = p - d0, type = T_INT;
  if (p < e && *p == '.') {
    p++; if (p >= e || !is_digit(*p)) return 0;
    while (p < e && is_digit(*p)) p++;
    type = T_FLOAT;
  }
  int64_t exp = 0;
  if (p < e && (*p == 'e' || *p == 'E')) {
    p++; int eneg = 0;
    if (p < e && (*p == '+' || *p == '-')) eneg = *p++ == '-';
    if (p >= e || !is_digit(*p)) return 0;
    while (p < e && is_digit(*p)) { if (exp < 100000) exp = exp * 10 + (*p - '0'); p++; }
    if (eneg) exp = -exp;
    type = T_FLOAT;
  }
  if (p - s > MAX_NUMBER) return 0;
  *finite = int_digits + exp < 300;
  *ival_ok = 0;
  if (type == T_INT && int_digits <= 18) {
    int64_t v = 0;
    for (const uint8_t *q = d0; q < d0 + int_digits; q++) v = v * 10 + (*q - '0');
    *ival = neg ? -v : v; *ival_ok = 1;
  }
  *pp = p;
  return (int)type;
}

static int scan_literal(const uint8_t **pp, const uint8_t *e, const char *lit, int n) {
  if (e - *pp < n || memcmp(*pp, lit, n) != 0) return 0;
  *pp += n;
  return 1;
}

#define NOT_A_CHAR 0xFFFFFFFFu

static inline int hex4(const uint8_t *p, uint32_t *v) {
  *v = 0;
  for (int k = 0; k < 4; k++) {
    uint8_t h = p[k];
    if (!is_hex(h)) return 0;
    *v = *v * 16 + (h <= '9' ? h - '0' : (h | 32) - 'a' + 10);
  }
  return 1;
}

/* The character at s + *i of a JSON string's raw content [s, s+n) (validated): its code point, *i moved past it
   (past an escape too); NOT_A_CHAR for a lone surrogate (*i past its escape), or for bytes that are not whole
   (*i at the end: the scan validated every string these are called on, so that cannot happen). */
static inline uint32_t next_char(const uint8_t *s, int64_t *i, int64_t n) {
  uint8_t c = s[*i];
  if (c < 0x80 && c != '\\') { *i += 1; return c; }
  if (c >= 0x80) {
    int k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (*i + k > n) { *i = n; return NOT_A_CHAR; }
    uint32_t v = c & (0x7F >> k);
    for (int j = 1; j < k; j++) v = (v << 6) | (s[*i + j] & 0x3F);
    *i += k; return v;
  }
  if (*i + 1 >= n) { *i = n; return NOT_A_CHAR; }
  uint8_t d = s[*i + 1];
  const char *simple = "\"\"\\\\//b\bf\fn\nr\rt\t";
  for (int j = 0; simple[j]; j += 2) if (d == (uint8_t)simple[j]) { *i += 2; return (uint8_t)simple[j + 1]; }
  uint32_t v, w;
  if (d != 'u' || *i + 6 > n || !hex4(s + *i + 2, &v)) { *i = n; return NOT_A_CHAR; }
  *i += 6;
  if (v >= 0xDC00 && v <= 0xDFFF) return NOT_A_CHAR;
  if (v < 0xD800 || v > 0xDBFF) return v;
  if (*i + 6 > n || s[*i] != '\\' || s[*i + 1] != 'u' || !hex4(s + *i + 2, &w) || w < 0xDC00 || w > 0xDFFF) return NOT_A_CHAR;
  *i += 6;
  return 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
}

/* Whether the decoded string [s, s+n) surely matches Python's `:=\s*by\s*$`; 0 means "not sure" (defer). */
static int by_end(ctx_t *c, const uint8_t *s, int32_t n) {
  if (c->scratch_cap < n) {
    uint8_t *b = realloc(c->scratch, n); if (!b) return 0;
    c->scratch = b; c->scratch_cap = n;
  }
  uint8_t *o = c->scratch; int64_t m = 0;
  for (int64_t i = 0; i < n; ) {     /* escapes decoded; any non-ASCII character (or lone surrogate) becomes 0x80 */
    uint32_t v = next_char(s, &i, n);
    o[m++] = v < 0x80 ? (uint8_t)v : 0x80;
  }
#define WS(x) ((x) == ' ' || ((x) >= 9 && (x) <= 13) || ((x) >= 0x1c && (x) <= 0x1f))
  while (m > 0 && WS(o[m - 1])) m--;
  if (m < 2 || o[m - 1] != 'y' || o[m - 2] != 'b') return 0;
  m -= 2;
  while (m > 0 && WS(o[m - 1])) m--;
  return m >= 2 && o[m - 1] == '=' && o[m - 2] == ':';
#undef WS
}

/* ---------------------------------------------------------------- one line */

typedef struct { uint8_t is_obj; int64_t key_base; } frame_t;

static inline int field_of(ctx_t *c, span_t k, int guess) {
  if (guess >= 0 && c->name_len[guess] == k.n && same_bytes(c->name[guess], k.p, k.n)) return guess;
  for (int i = 0; i < c->nfields; i++)
    if (c->name_len[i] == k.n && same_bytes(c->name[i], k.p, k.n)) return i;
  return -1;
}

/* Parse one non-blank line [p, e); 1 if fully valid and understood (its outputs written at `row`), else 0. */
static int scan_line(ctx_t *c, const uint8_t *p, const uint8_t *e, void **outs, int64_t row) {
  frame_t st[MAX_DEPTH];
  int depth = 0;
  int64_t nkeys = 0;
  uint32_t seen = 0;
  int pos = 0;                 /* the position of the next top-level key */
  int top_field = -1;          /* the schema field whose value comes next (at depth 1), or -1 */
  while (p < e && is_ws(*p)) p++;
  if (p >= e || *p != '{') return 0;
  p++; st[0].is_obj = 1; st[0].key_base = 0; depth = 1;
  goto object_key;

value:   /* a value is expected at p */
  while (p < e && is_ws(*p)) p++;
  if (p >= e) return 0;
  {
    int type, fld = top_field; top_field = -1;
    uint8_t ch = *p;
    if (ch == '{' || ch == '[') {
      if (depth == MAX_DEPTH) return 0;
      type = ch == '{' ? T_OBJ : T_LIST;
      if (fld >= 0 && !(c->types[fld] & type)) return 0;
      if (fld >= 0 && c->flags[fld] & (F_OUT | F_BY_END)) return 0;
      st[depth].is_obj = ch == '{'; st[depth].key_base = nkeys; depth++;
      p++;
      while (p < e && is_ws(*p)) p++;
      if (p < e && *p == (ch == '{' ? '}' : ']')) { p++; depth--; nkeys = st[depth].key_base; goto after_value; }
      if (ch == '{') goto object_key;
      goto value;
    }
    if (ch == '"') {
      span_t s; int esc;
      if (fld >= 0 && (c->flags[fld] & (F_OUT_STR | F_BY_END)) == F_OUT_STR && c->types[fld] & T_STR) {   /* the bytes of a latest value */
        intern_t *t = &c->intern[fld];
        for (int r = 0; r < 2; r++) {
          int32_t i = r ? t->last2 : t->last;
          if (i < 0) continue;
          int32_t n = t->len[i];
          if (e - p >= n + 2 && p[n + 1] == '"' && same_bytes(p + 1, t->arena + t->off[i], n)) {
            if (r) { t->last2 = t->last; t->last = i; }
            ((int32_t *)outs[fld])[row] = i; p += n + 2;
            goto after_value;
          }
        }
      }
      if (!scan_string(&p, e, &s, &esc)) return 0;
      if (fld >= 0) {
        if (!(c->types[fld] & T_STR)) return 0;
        int32_t f = c->flags[fld];
        if (f & F_OUT_INT) return 0;
        if (f & F_OUT_STR) {
          if (esc) return 0;
          int32_t id = intern(&c->intern[fld], s.p, s.n);
          if (id < 0) return 0;
          ((int32_t *)outs[fld])[row] = id;
        }
        if ((f & F_BY_END) && !by_end(c, s.p, s.n)) return 0;
        if (f & F_OUT_SPAN) {  /* where the raw string is in the file, and its length (-length-1 when it holds an escape) */
          int64_t *o = (int64_t *)outs[fld] + 2 * row;
          o[0] = c->base + (s.p - c->buf); o[1] = esc ? -(int64_t)s.n - 1 : s.n;
        }
      }
      goto after_value;
    }
    if (ch == '-' || is_digit(ch)) {
      int finite, ival_ok; int64_t ival = 0;
      type = scan_number(&p, e, &finite, &ival, &ival_ok);
      if (!type) return 0;
      if (fld >= 0) {
        int32_t t = c->types[fld], f = c->flags[fld];
        if (!(t & type)) return 0;
        if (type == T_FLOAT && !finite) return 0;
        if (f & (F_OUT_STR | F_OUT_SPAN)) return 0;
        if (f & (F_OUT_INT | F_NONNEG)) {
          if (type != T_INT || !ival_ok) return 0;
          if ((f & F_NONNEG) && ival < 0) return 0;
          if (f & F_OUT_INT) ((int64_t *)outs[fld])[row] = ival;
        }
      }
      goto after_value;
    }
    if (ch == 't' || ch == 'f') {
      if (!scan_literal(&p, e, ch == 't' ? "true" : "false", ch == 't' ? 4 : 5)) return 0;
      type = T_BOOL;
    } else if (ch == 'n') {
      if (!scan_literal(&p, e, "null", 4)) return 0;
      type = T_NULL;
    } else return 0;
    if (fld >= 0 && (!(c->types[fld] & type) || (c->flags[fld] & (F_OUT | F_NONNEG | F_BY_END)))) return 0;
    goto after_value;
  }

object_key:   /* inside an object, a key is expected at p (after '{' or ',') */
  while (p < e && is_ws(*p)) p++;
  if (p >= e || *p != '"') return 0;
  {
    span_t k; int esc;
    int32_t kl = depth == 1 && pos < MAX_FIELDS ? c->kpat_len[pos] : 0;
    if (kl && e - p >= kl && same_bytes(p, c->kpat[pos], kl)) {   /* the key this position had on the previous line */
      k.p = p + 1; k.n = kl - 2; p += kl;
      top_field = c->kpat_field[pos];
    } else {
      const uint8_t *q = p;
      if (!scan_string(&p, e, &k, &esc) || esc) return 0;   /* an escaped key could equal another one: defer */
      top_field = depth == 1 ? field_of(c, k, pos < MAX_FIELDS ? c->order[pos] : -1) : -1;
      if (top_field >= 0 && pos < MAX_FIELDS) {
        c->order[pos] = (int8_t)top_field;
        if (p - q <= KPAT) { memcpy(c->kpat[pos], q, p - q); c->kpat_len[pos] = (int32_t)(p - q); c->kpat_field[pos] = top_field; }
      }
    }
    /* A schema field at the top is a duplicate iff its bit is already set (only its own bytes equal it); every
       other key is compared with the other keys of its object kept so far. */
    if (top_field >= 0) {
      pos++;
      if (seen & (1u << top_field)) return 0;
      seen |= 1u << top_field;
    } else {
      int64_t base = st[depth - 1].key_base;
      if (nkeys - base >= MAX_KEYS) return 0;
      for (int64_t i = base; i < nkeys; i++)
        if (c->keys[i].n == k.n && same_bytes(c->keys[i].p, k.p, k.n)) return 0;   /* a duplicate key */
      if (nkeys == c->keys_cap) {
        int64_t cap = c->keys_cap * 2;
        span_t *nk = realloc(c->keys, sizeof(span_t) * cap); if (!nk) return 0;
        c->keys = nk; c->keys_cap = cap;
      }
      c->keys[nkeys++] = k;
    }
    while (p < e && is_ws(*p)) p++;
    if (p >= e || *p != ':') return 0;
    p++;
    goto value;
  }

after_value:
  while (p < e && is_ws(*p)) p++;
  if (p >= e) return 0;
  if (*p == ',') { p++; if (st[depth - 1].is_obj) goto object_key; goto value; }
  if (*p != (st[depth - 1].is_obj ? '}' : ']')) return 0;
  p++; depth--; nkeys = st[depth].key_base;
  if (depth > 0) goto after_value;
  while (p < e && is_ws(*p)) p++;
  if (p != e) return 0;
  return (seen & c->must) == c->must;
}

/* ---------------------------------------------------------------- the API */

void ejs_free(ctx_t *c) {
  if (!c) return;
  for (int i = 0; i < MAX_FIELDS; i++) {
    intern_t *t = &c->intern[i];
    free(t->arena); free(t->off); free(t->len); free(t->slots);
  }
  free(c->count.cnt); free(c->count.first); free(c->count.last);
  free(c->names); free(c->keys); free(c->scratch); free(c);
}

/* A scanner for `nfields` top-level fields: names concatenated in `names` (field i is [name_off[i], name_off[i+1])),
   each with its accepted type classes (T_*) and flags (F_*). NULL if it cannot be made. */
ctx_t *ejs_new(int nfields, const char *names, const int32_t *name_off, const int32_t *types, const int32_t *flags) {
  if (nfields < 0 || nfields > MAX_FIELDS) return NULL;
  ctx_t *c = calloc(1, sizeof(ctx_t));
  if (!c) return NULL;
  c->nfields = nfields;
  c->names = malloc(name_off[nfields] + 1);
  c->keys_cap = 64; c->keys = malloc(sizeof(span_t) * c->keys_cap);
  if (!c->names || !c->keys) { ejs_free(c); return NULL; }
  memcpy(c->names, names, name_off[nfields]);
  for (int i = 0; i < nfields; i++) {
    c->name[i] = c->names + name_off[i]; c->name_len[i] = name_off[i + 1] - name_off[i];
    c->types[i] = types[i]; c->flags[i] = flags[i];
    if (flags[i] & (F_REQUIRED | F_OUT)) c->must |= 1u << i;
  }
  for (int i = 0; i < MAX_FIELDS; i++) c->intern[i].last = c->intern[i].last2 = -1;
  memset(c->order, 0xff, sizeof c->order);
  return c;
}

static inline int blank_byte(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == 11 || b == 12; }

/* Counting mode: from now on ejs_scan keeps, instead of output rows, per distinct value of the str field `key` the
   rows with each value of the str field `val` (at most MAX_VALUES distinct), and checks that the int field `idx`
   increases along the rows of each key (then no (key, idx) pair is repeated). 0, or -1 for fields it cannot count. */
int ejs_count_by(ctx_t *c, int key, int idx, int val) {
  if (key < 0 || idx < 0 || val < 0 || key >= c->nfields || idx >= c->nfields || val >= c->nfields) return -1;
  if ((c->flags[key] & F_OUT) != F_OUT_STR || (c->flags[val] & F_OUT) != F_OUT_STR || (c->flags[idx] & F_OUT) != F_OUT_INT) return -1;
  for (int i = 0; i < c->nfields; i++) if (i != key && i != idx && i != val && (c->flags[i] & F_OUT)) return -1;
  c->count.on = 1; c->count.key = key; c->count.idx = idx; c->count.val = val;
  return 0;
}

/* Count the row just scanned: 0, or 2 when the caller must count by columns (an index not above its key's latest,
   too many distinct values, no memory). */
static int count_row(count_t *k) {
  int64_t id = k->row_key;
  if (k->row_val >= MAX_VALUES) return 2;
  if (id == k->n) {                          /* a new key: interned ids come in order, 0, 1, 2, ... */
    if (k->n == k->cap) {
      int64_t cap = k->cap ? 2 * k->cap : 1024;
      int64_t *a = realloc(k->cnt, sizeof(int64_t) * MAX_VALUES * cap); if (!a) return 2; k->cnt = a;
      int64_t *f = realloc(k->first, sizeof(int64_t) * cap); if (!f) return 2; k->first = f;
      int64_t *l = realloc(k->last, sizeof(int64_t) * cap); if (!l) return 2; k->last = l;
      k->cap = cap;
    }
    memset(k->cnt + MAX_VALUES * id, 0, sizeof(int64_t) * MAX_VALUES);
    k->first[id] = k->row_idx; k->last[id] = -1; k->n++;
  }
  if (k->row_idx <= k->last[id]) return 2;
  k->last[id] = k->row_idx;
  k->cnt[MAX_VALUES * id + k->row_val]++;
  return 0;
}

/* Scan the complete lines in [buf, buf+len) (the last one may lack its newline); `base` is buf's offset in the file.
   Rows of non-blank lines are written to outs[field] (int32 ids for F_OUT_STR, int64 for F_OUT_INT, two int64 for
   F_OUT_SPAN: the string's file offset and length) from index
   *nrows on, and the file offsets where their lines start to `starts` when it is not NULL; at most `cap` rows in all.
   In counting mode rows are counted instead (outs, starts and cap are not used).
   Returns 0 when every line is valid and understood; 1 when a line defers; -1 when the outputs are full (the rows
   before are done: call again from buf + *stop with more room); 2 in counting mode when the rows must be counted by
   columns instead. *stop is the offset in buf of the line concerned. */
int ejs_scan(ctx_t *c, const uint8_t *buf, int64_t len, void **outs, int64_t *starts, int64_t cap, int64_t base,
             int64_t *nrows, int64_t *stop) {
  const uint8_t *p = buf, *end = buf + len;
  int64_t row = *nrows;
  void *one[MAX_FIELDS] = {0};
  count_t *k = &c->count;
  if (k->on) { one[k->key] = &k->row_key; one[k->idx] = &k->row_idx; one[k->val] = &k->row_val; outs = one; starts = NULL; }
  c->buf = buf; c->base = base;
  while (p < end) {
    const uint8_t *nl = memchr(p, '\n', end - p);
    const uint8_t *e = nl ? nl : end;
    const uint8_t *q = p;
    while (q < e && blank_byte(*q)) q++;
    if (q < e) {             /* Python skips a line whose bytes are all ASCII whitespace (bytes.strip) */
      if (!k->on && row >= cap) { *stop = p - buf; *nrows = row; return -1; }
      if (!scan_line(c, p, e, outs, k->on ? 0 : row)) { *stop = p - buf; *nrows = row; return 1; }
      if (k->on && count_row(k)) { *stop = p - buf; *nrows = row; return 2; }
      if (starts) starts[row] = base + (p - buf);
      row++;
    }
    p = nl ? nl + 1 : end;
  }
  *nrows = row;
  return 0;
}

/* Counting mode's keys so far, and a copy of their counts (MAX_VALUES a key, by value id), first and latest index. */
int64_t ejs_n_counted(ctx_t *c) { return c->count.n; }
void ejs_counted(ctx_t *c, int64_t *cnt, int64_t *first, int64_t *last) {
  count_t *k = &c->count;
  if (!k->n) return;
  memcpy(cnt, k->cnt, sizeof(int64_t) * MAX_VALUES * k->n);
  memcpy(first, k->first, sizeof(int64_t) * k->n); memcpy(last, k->last, sizeof(int64_t) * k->n);
}

/* The interned values of field i: their number, and the total bytes they take. */
int64_t ejs_n_unique(ctx_t *c, int i, int64_t *nbytes) { *nbytes = c->intern[i].arena_len; return c->intern[i].n; }

/* Copy the interned values of field i: bytes to `arena`, offsets (n + 1 of them) to `off`. */
void ejs_uniques(ctx_t *c, int i, uint8_t *arena, int64_t *off) {
  intern_t *t = &c->intern[i];
  if (t->arena_len) memcpy(arena, t->arena, t->arena_len);
  for (int64_t k = 0; k < t->n; k++) off[k] = t->off[k];
  off[t->n] = t->arena_len;
}

/* ---------------------------------------------------------------- statement keys */

static inline int begins(const uint8_t *p, int64_t n, const char *lit) {
  int64_t k = (int64_t)strlen(lit);
  return n >= k && memcmp(p, lit, k) == 0;
}

/* 1 for the blanks a plain statement may hold (collapsed to one space), -1 for a character that makes it not plain:
   every other character Python's str.split splits at, other controls, and what opens a literal (a quote, `'`);
   0 for the rest. */
static inline int char_class(uint32_t v) {
  if (v == ' ' || v == '\n' || v == '\t' || v == '\r') return 1;
  if (v < 0x20 || v == 0x7F || (v >= 0x80 && v <= 0xA0) || v == 0x1680 || (v >= 0x2000 && v <= 0x200A) || v == 0x2028 ||
      v == 0x2029 || v == 0x202F || v == 0x205F || v == 0x3000) return -1;
  if (v == '"' || v == '\'') return -1;
  return 0;
}

static inline int64_t put_utf8(uint8_t *o, uint32_t v) {
  if (v < 0x80) { o[0] = (uint8_t)v; return 1; }
  if (v < 0x800) { o[0] = 0xC0 | (v >> 6); o[1] = 0x80 | (v & 0x3F); return 2; }
  if (v < 0x10000) { o[0] = 0xE0 | (v >> 12); o[1] = 0x80 | ((v >> 6) & 0x3F); o[2] = 0x80 | (v & 0x3F); return 3; }
  o[0] = 0xF0 | (v >> 18); o[1] = 0x80 | ((v >> 12) & 0x3F); o[2] = 0x80 | ((v >> 6) & 0x3F); o[3] = 0x80 | (v & 0x3F); return 4;
}

/* ei_nb.core.statement_key of a *plain* statement, computed from the raw content [s, s+n) of its JSON string (the
   scan validated it: grammar, escapes, UTF-8). Plain means the Python key takes its shortest path:
   - nothing that can open a comment or a literal (ei_nb.lean_lex._plain: no `--`, `/-`, quote or `'`), so the code
     is the whole text;
   - no blank but the space, \n, \t and \r: every other character that Python's str.split splits at makes it not
     plain, as do the other control characters and U+0080..U+00A0.
   Escapes (\uXXXX and surrogate pairs included) are decoded first. The key is then the text with its blank runs
   collapsed to one space and its ends stripped (normalize_ws), a leading `[@[...]] [private |protected ]theorem|lemma
   NAME` replaced by `theorem _` (core._DECL), and a final `:= by` dropped with the blank before it
   (core._without_by_tail). It is written to out as UTF-8 (room for n + 16 bytes); returns its length, or -1 when
   the statement is not plain and Python must key it. */
static int64_t plain_key(const uint8_t *s, int64_t n, uint8_t *out) {
  int64_t m = 0, i = 0;
  int blank = 0;                       /* a blank run since the last character written */
  uint8_t last = 0;                    /* the last byte written: `--` and `/-` are found as they are written (blanks
                                          collapse but never join, so the text has them where the key has them) */
  while (i < n) {
    uint8_t c = s[i];
    if (c > ' ' && c < 0x7F && c != '\\' && c != '"' && c != '\'') i++;   /* printable ASCII: the common case */
    else {
      uint32_t v = next_char(s, &i, n);
      if (v == NOT_A_CHAR) return -1;      /* (a NUL, like every control character, is refused by char_class) */
      int cls = char_class(v);
      if (cls < 0) return -1;
      if (cls > 0) { blank = 1; continue; }
      if (v >= 0x80) {
        if (blank && m) out[m++] = ' ';
        blank = 0;
        m += put_utf8(out + m, v);      /* an escape is never longer than its UTF-8 bytes */
        last = 0x80;
        continue;
      }
      c = (uint8_t)v;
    }
    if (blank && m) { out[m++] = ' '; last = ' '; }
    blank = 0;
    if (c == '-' && (last == '-' || last == '/')) return -1;
    out[m++] = last = c;
  }
  /* core._DECL on the normalised text: every optional part is fixed by its first bytes, so no backtracking is needed */
  int64_t p = 0;
  if (begins(out, m, "@[")) {
    const uint8_t *r = memchr(out + 2, ']', m - 2);
    p = r ? r - out + 1 : -1;
    if (p > 0 && p < m && out[p] == ' ') p++;
  }
  if (p >= 0) {
    if (begins(out + p, m - p, "private ")) p += 8;
    else if (begins(out + p, m - p, "protected ")) p += 10;
    if (begins(out + p, m - p, "theorem ")) p += 8;
    else if (begins(out + p, m - p, "lemma ")) p += 6;
    else p = -1;
  }
  if (p > 0 && p < m && out[p] != ' ') {     /* the name: one or more bytes up to the next blank */
    int64_t e = p;
    while (e < m && out[e] != ' ') e++;
    memmove(out + 9, out + e, m - e);
    memcpy(out, "theorem _", 9);
    m = 9 + (m - e);
  }
  if (m >= 2 && out[m - 1] == 'y' && out[m - 2] == 'b') {      /* core._without_by_tail */
    int64_t t = m - 2;
    if (t > 0 && out[t - 1] == ' ') t--;
    if (t >= 2 && out[t - 1] == '=' && out[t - 2] == ':') { t -= 2; if (t > 0 && out[t - 1] == ' ') t--; m = t; }
  }
  return m;
}

/* The keys of `count` statements: statement i is the raw content of a JSON string at data + off[i], len[i] bytes
   (len[i] < 0: -len[i]-1 bytes holding escapes, as the scan's F_OUT_SPAN reports them). The keys are written one
   after the other to the arena as UTF-8; key i starts key_off[i] characters into it and is key_len[i] characters
   long, or key_len[i] = -1 when the statement is not plain. Returns the bytes written. The arena needs room for the
   statements' bytes plus 16 per statement. */
int64_t ejs_plain_keys(const uint8_t *data, const int64_t *off, const int64_t *len, int64_t count, uint8_t *arena,
                       int64_t *key_off, int64_t *key_len) {
  int64_t at = 0, chars = 0;
  for (int64_t i = 0; i < count; i++) {
    int64_t n = len[i] < 0 ? -len[i] - 1 : len[i];
    int64_t m = plain_key(data + off[i], n, arena + at);
    key_off[i] = chars; key_len[i] = m;
    if (m < 0) continue;
    int64_t c = 0;
    for (int64_t j = 0; j < m; j++) c += (arena[at + j] & 0xC0) != 0x80;   /* characters: bytes that start one */
    key_len[i] = c; chars += c; at += m;
  }
  return at;
}
