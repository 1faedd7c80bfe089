/*
 * istio-cni launcher: the executable the container runtime runs. It embeds the CPython runtime
 * shipped in the support directory beside it (SUPPORT_DIR, named with a content hash) and runs
 * the `plugin` package from there: no Python needed on the host, one exec, no unpacking.
 *
 * The interpreter is isolated (no environment variables, no site, no user dirs, no bytecode
 * writes) and in UTF-8 mode, so the node's environment cannot change what runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Not run_module: runpy and importlib.util would add their imports to every start. */
#define RUN "import sys\nfrom plugin.main import main\nsys.exit(main())\n"

#ifndef SUPPORT_DIR
#error "build with -DSUPPORT_DIR=\"istio-cni-<hash>.d\""
#endif

/* A CNI error object on stdout, as the runtime expects when a plugin fails. */
static int fail(const char *msg, const char *details) {
    printf("{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"istio-cni: %s\",\"details\":\"%s\"}\n",
           msg, details);
    fprintf(stderr, "istio-cni: %s: %s\n", msg, details);
    return 1;
}

static PyStatus append_path(PyConfig *config, const char *home, const char *sub) {
    char path[PATH_MAX];
    wchar_t *wide;
    PyStatus status;
    snprintf(path, sizeof path, "%s/%s", home, sub);
    wide = Py_DecodeLocale(path, NULL);
    if (wide == NULL) return PyStatus_NoMemory();
    status = PyWideStringList_Append(&config->module_search_paths, wide);
    PyMem_RawFree(wide);
    return status;
}

int main(int argc, char **argv) {
    char exe[PATH_MAX], home[PATH_MAX];
    struct stat st;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return fail("cannot find its own path", "readlink /proc/self/exe failed");
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(home, sizeof home, "%s/%s", exe, SUPPORT_DIR);
    if (stat(home, &st) != 0 || !S_ISDIR(st.st_mode))
        return fail("support directory missing", SUPPORT_DIR);

    PyPreConfig preconfig;
    PyPreConfig_InitIsolatedConfig(&preconfig);
    preconfig.utf8_mode = 1;
    PyStatus status = Py_PreInitialize(&preconfig);
    if (PyStatus_Exception(status)) Py_ExitStatusException(status);

    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.site_import = 0;
    config.write_bytecode = 0;
    config.pathconfig_warnings = 0;
    config.module_search_paths_set = 1;
    status = PyConfig_SetBytesString(&config, &config.home, home);
    if (!PyStatus_Exception(status)) status = append_path(&config, home, "lib/python");
    if (!PyStatus_Exception(status)) status = append_path(&config, home, "lib/lib-dynload");
    if (!PyStatus_Exception(status))
        status = PyConfig_SetBytesString(&config, &config.run_command, RUN);
    if (!PyStatus_Exception(status)) status = PyConfig_SetBytesArgv(&config, argc, argv);
    if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) Py_ExitStatusException(status);
    return Py_RunMain();
}
