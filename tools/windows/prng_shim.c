/* Test-only stand-in for bcryptprimitives.dll under Wine 8, which lacks ProcessPrng (Rust's std
 * imports it on Windows 10+ targets). Built by tools/windows_e2e.sh with mingw and put beside the
 * .exe files in a temporary test folder; NEVER shipped: packaging/dist.sh refuses an archive
 * that contains it. Real Windows (10 and later) has ProcessPrng in its own bcryptprimitives.dll. */
#include <windows.h>

/* advapi32's RtlGenRandom. */
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG chunk = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk)) return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
