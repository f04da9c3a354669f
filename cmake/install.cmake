# Install rules and the CMake package: after `cmake --install build --prefix P`, another project
# finds the library with find_package(seqpar) (CMAKE_PREFIX_PATH=P) and links seqpar::seqpar,
# which carries the public include directory, the SEQPAR_HAVE_* definitions and the link
# dependencies (OpenMP, Threads, and MPI / CUDA / cuDNN / NCCL when this build has them).
include(CMakePackageConfigHelpers)

set(SEQPAR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/seqpar)

install(TARGETS seqpar EXPORT seqparTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/seqpar DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET seqpar_cli)
  install(TARGETS seqpar_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT seqparTargets NAMESPACE seqpar:: DESTINATION ${SEQPAR_CMAKE_DIR})

# The config re-finds what the exported target names (find_dependency), with the same
# choices this build made; the values are baked in at configure time.
set(SEQPAR_CONFIG_HAVE_MPI ${MPI_CXX_FOUND})
if(NOT SEQPAR_CONFIG_HAVE_MPI)
  set(SEQPAR_CONFIG_HAVE_MPI OFF)
endif()
configure_package_config_file(cmake/seqparConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/seqparConfig.cmake
                              INSTALL_DESTINATION ${SEQPAR_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/seqparConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/seqparConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/seqparConfigVersion.cmake
        DESTINATION ${SEQPAR_CMAKE_DIR})
