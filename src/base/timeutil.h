/* timeutil.h — monotonic and wall clocks in seconds (double). */
#ifndef CV_TIMEUTIL_H
#define CV_TIMEUTIL_H

double cv_now(void);      /* CLOCK_MONOTONIC, for durations */
double cv_wall_now(void); /* CLOCK_REALTIME, for timestamps shown to users */

#endif
