/* session_int.h — internal session hooks (calibration statistics collection). */
#ifndef MOET_RUNTIME_SESSION_INT_H
#define MOET_RUNTIME_SESSION_INT_H

#include "moet.h"
#include "quant/calib.h"

/* While set, every MoE layer's forward accumulates its experts' input statistics into c. */
void moet_session_set_calib(moet_session *s, moet_calib *c);

/* 0: base experts; 1: base + delta ("on"); the model must have delta weights for 1. */
void moet_session_use_delta(moet_session *s, int on);

#endif
