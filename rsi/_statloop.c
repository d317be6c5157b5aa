/* rsi._statloop: the stat loop of a state's check, in C (rsi/native.py loads it; without it,
 * rsi/native.py runs the same loop in Python).
 *
 * stale(parts, prefix, follow, sig_at, mode_at, threads, linked) looks at every (key, value)
 * of the dicts in `parts` and returns (keys, linked_keys):
 *   keys: every key that is not *clean*: not a str, not encodable as a path, whose path
 *         (the key, or prefix + "/" + key[:2] + "/" + key) cannot be stat'ed (lstat, or stat
 *         with `follow`), or whose value does not hold that very stat's signature
 *         (st_ino, st_size, st_mtime_ns, st_ctime_ns) as a tuple of four ints, or of six
 *         ending in that stat's st_uid and st_mode (a prepared tree's entries; the value
 *         itself with sig_at < 0, else value[sig_at] of a list), or, with mode_at >= 0, whose
 *         value is not a list of exactly mode_at + 1 items ending in that stat's st_mode;
 *   linked_keys (with `linked`): the clean keys whose stat shows more than one link or a
 *         symbolic link.
 * A key it cannot judge is never called clean: the caller looks at every key returned again
 * itself, one by one, as it always did.
 *
 * Every item is taken (a reference held) before any stat, so a dict changed meanwhile by
 * another thread cannot make it skip one; a dict whose size changed during the call is an
 * error, as it is for a Python loop over it. The stats run with the interpreter's lock
 * released, split over `threads` threads, in chunks between which a signal (Ctrl-C) is
 * noticed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#define CHUNK 32768
#define MAX_THREADS 16

typedef struct {
    unsigned long long ino;
    long long size;
    long long mtime_ns;
    long long ctime_ns;
    unsigned int mode;
    unsigned long long uid;
    unsigned long long nlink;
    int ok; /* 1: stat'ed; 0: it failed; -1: no path (not looked at) */
} result_t;

typedef struct {
    char **paths;
    result_t *out;
    Py_ssize_t lo, hi;
    int follow;
} job_t;

static void *run_job(void *arg) {
    job_t *j = (job_t *)arg;
    struct stat st;
    for (Py_ssize_t i = j->lo; i < j->hi; i++) {
        result_t *r = &j->out[i];
        if (j->paths[i] == NULL) {
            r->ok = -1;
            continue;
        }
        int rc = j->follow ? stat(j->paths[i], &st) : lstat(j->paths[i], &st);
        if (rc != 0) {
            r->ok = 0;
            continue;
        }
        /* a time whose nanoseconds overflow 64 bits is not judged here (the caller looks) */
        if (st.st_mtim.tv_sec > 9000000000LL || st.st_mtim.tv_sec < -9000000000LL ||
            st.st_ctim.tv_sec > 9000000000LL || st.st_ctim.tv_sec < -9000000000LL) {
            r->ok = -1;
            continue;
        }
        r->ok = 1;
        r->ino = (unsigned long long)st.st_ino;
        r->size = (long long)st.st_size;
        r->mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        r->ctime_ns = (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
        r->mode = (unsigned int)st.st_mode;
        r->uid = (unsigned long long)st.st_uid;
        r->nlink = (unsigned long long)st.st_nlink;
    }
    return NULL;
}

/* 1 when `v` is an exact int equal to `want` (unsigned when `is_unsigned`); 0 otherwise,
 * with no error left set. */
static int int_is(PyObject *v, long long want, int is_unsigned) {
    if (!PyLong_CheckExact(v))
        return 0;
    if (is_unsigned) {
        unsigned long long got = PyLong_AsUnsignedLongLong(v);
        if (got == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return got == (unsigned long long)want;
    }
    int overflow = 0;
    long long got = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (got == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return got == want;
}

static int clean(PyObject *value, const result_t *r, int sig_at, int mode_at) {
    if (r->ok != 1)
        return 0;
    PyObject *sig = value;
    if (sig_at >= 0 || mode_at >= 0) {
        if (!PyList_CheckExact(value))
            return 0;
        Py_ssize_t n = PyList_GET_SIZE(value);
        if (mode_at >= 0) {
            if (n != mode_at + 1)
                return 0;
            if (!int_is(PyList_GET_ITEM(value, mode_at), (long long)r->mode, 0))
                return 0;
        }
        if (sig_at >= 0) {
            if (sig_at >= n)
                return 0;
            sig = PyList_GET_ITEM(value, sig_at);
        }
    }
    if (!PyTuple_CheckExact(sig))
        return 0;
    Py_ssize_t fields = PyTuple_GET_SIZE(sig);
    if (fields != 4 && fields != 6)
        return 0;
    if (fields == 6 && !(int_is(PyTuple_GET_ITEM(sig, 4), (long long)r->uid, 1) &&
                         int_is(PyTuple_GET_ITEM(sig, 5), (long long)r->mode, 0)))
        return 0;
    return int_is(PyTuple_GET_ITEM(sig, 0), (long long)r->ino, 1) &&
           int_is(PyTuple_GET_ITEM(sig, 1), r->size, 0) &&
           int_is(PyTuple_GET_ITEM(sig, 2), r->mtime_ns, 0) &&
           int_is(PyTuple_GET_ITEM(sig, 3), r->ctime_ns, 0);
}

/* The path of `key` (a new malloc'ed string), or NULL where it has none (no error set). */
static char *path_of(PyObject *key, const char *prefix, Py_ssize_t prefix_len) {
    if (!PyUnicode_CheckExact(key))
        return NULL;
    Py_ssize_t n;
    const char *text = PyUnicode_AsUTF8AndSize(key, &n);
    if (text == NULL) { /* a lone surrogate: os.fsencode's bytes differ; the caller looks */
        PyErr_Clear();
        return NULL;
    }
    if ((Py_ssize_t)strlen(text) != n || n == 0)
        return NULL;
    if (prefix == NULL) {
        char *p = malloc((size_t)n + 1);
        if (p != NULL)
            memcpy(p, text, (size_t)n + 1);
        return p;
    }
    if (n < 2)
        return NULL;
    size_t total = (size_t)prefix_len + 1 + 2 + 1 + (size_t)n + 1;
    char *p = malloc(total);
    if (p == NULL)
        return NULL;
    char *w = p;
    memcpy(w, prefix, (size_t)prefix_len);
    w += prefix_len;
    *w++ = '/';
    /* key[:2] is its first two characters: two bytes only when they are ASCII */
    if ((unsigned char)text[0] >= 0x80 || (unsigned char)text[1] >= 0x80) {
        free(p);
        return NULL;
    }
    *w++ = text[0];
    *w++ = text[1];
    *w++ = '/';
    memcpy(w, text, (size_t)n + 1);
    return p;
}

static int stat_chunk(char **paths, result_t *out, Py_ssize_t n, int follow, int threads) {
    job_t jobs[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS];
    if (threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (n < 2048)
        threads = 1;
    Py_ssize_t per = (n + threads - 1) / threads;
    for (int t = 0; t < threads; t++) {
        jobs[t].paths = paths;
        jobs[t].out = out;
        jobs[t].lo = t * per < n ? t * per : n;
        jobs[t].hi = (t + 1) * per < n ? (t + 1) * per : n;
        jobs[t].follow = follow;
        started[t] = 0;
    }
    Py_BEGIN_ALLOW_THREADS
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&tids[t], NULL, run_job, &jobs[t]) == 0;
    run_job(&jobs[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(tids[t], NULL);
        else
            run_job(&jobs[t]); /* no thread to be had: this one does its share */
    }
    Py_END_ALLOW_THREADS
    return 0;
}

static PyObject *stale(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"parts", "prefix", "follow", "sig_at", "mode_at", "threads", "linked",
                            NULL};
    PyObject *parts, *prefix_obj = Py_None;
    int follow = 0, sig_at = -1, mode_at = -1, threads = 1, want_linked = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Opiiip", names, &parts, &prefix_obj, &follow,
                                     &sig_at, &mode_at, &threads, &want_linked))
        return NULL;
    const char *prefix = NULL;
    Py_ssize_t prefix_len = 0;
    if (prefix_obj != Py_None) {
        if (!PyUnicode_Check(prefix_obj)) {
            PyErr_SetString(PyExc_TypeError, "stale: prefix must be a str or None");
            return NULL;
        }
        prefix = PyUnicode_AsUTF8AndSize(prefix_obj, &prefix_len);
        if (prefix == NULL)
            return NULL;
        if ((Py_ssize_t)strlen(prefix) != prefix_len) {
            PyErr_SetString(PyExc_ValueError, "stale: prefix holds a NUL");
            return NULL;
        }
    }
    PyObject *seq = PySequence_Fast(parts, "stale: parts must be a sequence of dicts");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nparts = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t total = 0;
    Py_ssize_t *sizes = PyMem_Calloc((size_t)(nparts ? nparts : 1), sizeof(Py_ssize_t));
    if (sizes == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nparts; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyDict_Check(d)) {
            PyMem_Free(sizes);
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "stale: every part must be a dict");
            return NULL;
        }
        sizes[i] = PyDict_GET_SIZE(d);
        total += sizes[i];
    }
    /* every item taken first, references held: nothing another thread does can skip one */
    PyObject **keys = PyMem_Calloc((size_t)(total ? total : 1), sizeof(PyObject *));
    PyObject **values = PyMem_Calloc((size_t)(total ? total : 1), sizeof(PyObject *));
    PyObject *out = PyList_New(0), *out_linked = PyList_New(0);
    char **paths = PyMem_Calloc(CHUNK, sizeof(char *));
    result_t *results = PyMem_Calloc(CHUNK, sizeof(result_t));
    PyObject *answer = NULL;
    Py_ssize_t taken = 0;
    if (keys == NULL || values == NULL || paths == NULL || results == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (out == NULL || out_linked == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nparts; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(seq, i), *k, *v;
        Py_ssize_t pos = 0, seen = 0;
        while (PyDict_Next(d, &pos, &k, &v)) {
            if (taken == total || ++seen > sizes[i]) {
                PyErr_SetString(PyExc_RuntimeError, "stale: a dict changed size meanwhile");
                goto done;
            }
            Py_INCREF(k);
            Py_INCREF(v);
            keys[taken] = k;
            values[taken] = v;
            taken++;
        }
    }
    if (taken != total) {
        PyErr_SetString(PyExc_RuntimeError, "stale: a dict changed size meanwhile");
        goto done;
    }
    for (Py_ssize_t lo = 0; lo < total; lo += CHUNK) {
        Py_ssize_t n = total - lo < CHUNK ? total - lo : CHUNK;
        for (Py_ssize_t i = 0; i < n; i++)
            paths[i] = path_of(keys[lo + i], prefix, prefix_len);
        stat_chunk(paths, results, n, follow, threads);
        for (Py_ssize_t i = 0; i < n; i++) {
            free(paths[i]);
            paths[i] = NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            const result_t *r = &results[i];
            PyObject *k = keys[lo + i];
            if (!clean(values[lo + i], r, sig_at, mode_at)) {
                if (PyList_Append(out, k) < 0)
                    goto done;
            } else if (want_linked && (r->nlink > 1 || S_ISLNK(r->mode))) {
                if (PyList_Append(out_linked, k) < 0)
                    goto done;
            }
        }
        if (PyErr_CheckSignals() < 0)
            goto done;
    }
    for (Py_ssize_t i = 0; i < nparts; i++) {
        if (PyDict_GET_SIZE(PySequence_Fast_GET_ITEM(seq, i)) != sizes[i]) {
            PyErr_SetString(PyExc_RuntimeError, "stale: a dict changed size meanwhile");
            goto done;
        }
    }
    answer = PyTuple_Pack(2, out, out_linked);
done:
    for (Py_ssize_t i = 0; i < taken; i++) {
        Py_DECREF(keys[i]);
        Py_DECREF(values[i]);
    }
    PyMem_Free(keys);
    PyMem_Free(values);
    PyMem_Free(paths);
    PyMem_Free(results);
    PyMem_Free(sizes);
    Py_XDECREF(out);
    Py_XDECREF(out_linked);
    Py_DECREF(seq);
    return answer;
}

static PyMethodDef methods[] = {
    {"stale", (PyCFunction)(void (*)(void))stale, METH_VARARGS | METH_KEYWORDS,
     "stale(parts, prefix=None, follow=False, sig_at=-1, mode_at=-1, threads=1, linked=False)"
     " -> (keys not clean, clean keys with links): see rsi/native.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_statloop",
                                    "The stat loop of a state's check (rsi/native.py).", -1,
                                    methods};

#ifndef SOURCE_DIGEST
#define SOURCE_DIGEST ""
#endif

PyMODINIT_FUNC PyInit__statloop(void) {
    PyObject *m = PyModule_Create(&module);
    /* rsi/native.py uses the module only when this names the source next to it */
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
